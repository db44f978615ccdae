//! Structured output: the llguidance backend on a small byte-level tokenizer, and constrained
//! requests through the engine on the tiny model.

mod common;

use common::*;
use rsgl_engine::grammar::{Grammar, GrammarBackend, GrammarSource, LlgBackend};
use rsgl_engine::request::FinishReason;
use rsgl_engine::{EngineError, GenerateRequest};
use std::time::Duration;

/// A backend over [`ascii_tokenizer`]; not `canonical`, the tokenizer prepends a space to every
/// text as SentencePiece does, so forced text cannot be tokenized.
fn backend(canonical: bool) -> LlgBackend {
    let tokenizer = if canonical { ascii_tokenizer() } else { ascii_tokenizer_with_normalizer(serde_json::json!({"type": "Prepend", "prepend": " "})) };
    LlgBackend::new(tokenizer, &[0]).unwrap()
}

fn allowed(grammar: &mut dyn Grammar) -> Vec<u32> {
    let mut mask = vec![0u32; VOCAB.div_ceil(32)];
    grammar.fill_mask(&mut mask).unwrap();
    (0..VOCAB as u32).filter(|&t| mask[t as usize / 32] >> (t % 32) & 1 == 1).collect()
}

fn ids(text: &str) -> Vec<u32> {
    text.chars().map(ascii_id).collect()
}

#[test]
fn masks_allow_exactly_the_continuations_of_the_grammar() {
    let mut g = backend(false).compile(&GrammarSource::Regex("a[bc]{2}".into())).unwrap();
    assert_eq!(allowed(&mut *g), vec![ascii_id('a'), AB], "'a', or the 'ab' token");
    g.commit(ascii_id('a')).unwrap();
    assert_eq!(allowed(&mut *g), ids("bc"));
    g.commit(ascii_id('b')).unwrap();
    g.rollback(1).unwrap();
    assert_eq!(allowed(&mut *g), ids("bc"), "rolled back to after 'a'");
    assert!(g.commit(ascii_id('x')).is_err(), "a token outside the mask is refused");
}

#[test]
fn a_finished_grammar_allows_only_eos() {
    let mut g = backend(false).compile(&GrammarSource::Choices(vec!["no".into(), "say \"hi\"".into()])).unwrap();
    for t in ids("say \"hi") {
        g.commit(t).unwrap();
    }
    assert_eq!(allowed(&mut *g), ids("\""));
    g.commit(ascii_id('"')).unwrap();
    assert!(allowed(&mut *g).iter().all(|&t| t == 0), "only EOS may follow a complete choice");
}

#[test]
fn json_is_laid_out_compactly_with_a_space_after_separators() {
    let schema =
        r#"{"type": "object", "properties": {"x": {"type": "integer"}, "y": {"type": "boolean"}}, "required": ["x", "y"], "additionalProperties": false}"#;
    let mut g = backend(false).compile(&GrammarSource::JsonSchema(schema.into())).unwrap();
    for (i, t) in ids(r#"{"x": 12, "y": true}"#).into_iter().enumerate() {
        assert!(allowed(&mut *g).contains(&t), "token {i} ({:?}) refused", ascii_text(&[t]));
        g.commit(t).unwrap();
    }
    assert!(g.is_finished() || allowed(&mut *g) == vec![0], "the object is complete");
}

#[test]
fn invalid_grammars_are_refused_with_the_field_and_the_backends_message() {
    let b = backend(false);
    let cases = [
        (GrammarSource::Regex("(ab".into()), "regex"),
        (GrammarSource::JsonSchema(r#"{"type": "objekt"}"#.into()), "objekt"),
        (GrammarSource::JsonSchema("{not json".into()), "not valid JSON"),
        (GrammarSource::Ebnf("root ::= \"a\"".into()), "Lark"),
        (GrammarSource::Ebnf("start: missing_rule".into()), "ebnf"),
        (GrammarSource::Choices(vec![]), "at least one choice"),
    ];
    for (source, expected) in cases {
        match b.compile(&source) {
            Err(EngineError::InvalidRequest(message)) => assert!(message.contains(expected), "{source:?}: {message}"),
            Err(other) => panic!("{source:?}: wrong error kind {other:?}"),
            Ok(_) => panic!("{source:?} compiled"),
        }
    }
}

#[test]
fn forced_text_is_tokenized_as_the_tokenizer_would() {
    let source = GrammarSource::Choices(vec!["abcd!".into()]);
    let canonical = backend(true);
    assert!(canonical.can_jump_forward());
    let mut g = canonical.compile(&source).unwrap();
    let forced = g.forced_tokens();
    assert_eq!(forced.first(), Some(&AB), "the 'ab' merge, as the tokenizer spells it: {forced:?}");
    assert!("abcd!".starts_with(&ascii_text(&forced)), "{forced:?}");
    let approximate = backend(false);
    assert!(!approximate.can_jump_forward(), "with a tokenizer that prepends a space nothing is forced");
    assert!(approximate.compile(&source).unwrap().forced_tokens().is_empty());
}

fn constrained(rid: &str, params: &str) -> GenerateRequest {
    GenerateRequest::from_json(&format!(r#"{{"rid": "{rid}", "input_ids": [5, 6, 7], "sampling_params": {params}}}"#)).unwrap()
}

/// Whether `text` matches `(yes|no) [a-c]{2,4}!`.
fn matches_answer(text: &str) -> bool {
    let Some(rest) = text.strip_prefix("yes ").or_else(|| text.strip_prefix("no ")) else { return false };
    let Some(letters) = rest.strip_suffix('!') else { return false };
    (2..=4).contains(&letters.len()) && letters.chars().all(|c| ('a'..='c').contains(&c))
}

#[test]
fn sampled_outputs_match_their_grammar_alongside_free_requests() {
    let e = engine_with_tokenizer("{}");
    let mut streams = Vec::new();
    for seed in 0..12 {
        let params = format!(r#"{{"temperature": 1.0, "seed": {seed}, "max_new_tokens": 32, "regex": "(yes|no) [a-c]{{2,4}}!"}}"#);
        streams.push((true, e.submit(constrained(&format!("c{seed}"), &params)).unwrap()));
        let free = format!(r#"{{"temperature": 1.0, "seed": {seed}, "max_new_tokens": 16}}"#);
        streams.push((false, e.submit(constrained(&format!("f{seed}"), &free)).unwrap()));
    }
    for (is_constrained, stream) in streams {
        let (tokens, out) = collect(stream);
        let finished = out.finished.unwrap();
        if is_constrained {
            let text = ascii_text(&tokens);
            assert!(matches_answer(&text), "{text:?}");
            assert!(matches!(finished.finish_reason, FinishReason::Stop { .. }), "{:?}", finished.finish_reason);
        } else {
            assert_eq!(tokens.len(), finished.completion_tokens);
        }
    }
    let grammar = e.stats().grammar.expect("the engine has a tokenizer");
    assert_eq!(grammar.compiled, 1, "twelve requests arriving together share one compilation: {grammar:?}");
    assert_drained(&e);
}

#[test]
fn jump_forward_appends_forced_text_in_one_step() {
    let params = r#"{"temperature": 0, "max_new_tokens": 40, "regex": "hello world [0-9]{3}"}"#;
    let run = |opts: &str| {
        let e = engine_with_tokenizer(opts);
        let (tokens, out) = collect(e.submit(constrained("jf", params)).unwrap());
        let stats = e.stats();
        (ascii_text(&tokens), out.finished.unwrap(), stats.forced_tokens)
    };
    let (text, on, forced) = run("{}");
    let (text_off, off, forced_off) = run(r#"{"disable_jump_forward": true}"#);
    assert_eq!(text, text_off, "greedy output is the same either way");
    assert!(text.starts_with("hello world ") && text.len() == 15, "{text:?}");
    // Off: every output token but the last runs through the model once.
    assert_eq!((off.decode_steps, forced_off), (off.completion_tokens - 1, 0));
    // On: 'h' is sampled, "ello world " appended in one pass, then one step per digit.
    assert!(on.decode_steps <= 4 && forced >= 10, "{on:?}, forced {forced}");
}

#[test]
fn a_bad_grammar_fails_its_request_and_the_engine_keeps_serving() {
    let e = engine_with_tokenizer("{}");
    let params = r#"{"max_new_tokens": 4, "regex": "(unclosed"}"#;
    let mut stream = e.submit(constrained("bad", params)).unwrap();
    match stream.next(Duration::from_secs(30)) {
        Err(EngineError::InvalidRequest(message)) => assert!(message.starts_with("regex:"), "{message}"),
        other => panic!("expected the compile error, got {other:?}"),
    }
    let parsed: rsgl_engine::sample::SamplingParams = serde_json::from_str(params).unwrap();
    assert!(matches!(e.check_grammar(&parsed), Err(EngineError::InvalidRequest(_))));
    let both = r#"{"regex": "a", "choices": ["a"]}"#;
    let err = e.submit(constrained("both", both)).err().expect("two grammars are refused");
    assert!(err.to_string().contains("at most one"), "{err}");
    let (tokens, _) = collect(e.submit(constrained("good", r#"{"max_new_tokens": 8, "choices": ["abc"]}"#)).unwrap());
    assert_eq!(ascii_text(&tokens), "abc");
    assert_drained(&e);
}

#[test]
fn constrained_requests_need_the_tokenizer() {
    let e = engine("llama", "{}");
    let err = e.submit(constrained("r", r#"{"regex": "a"}"#)).err().expect("refused");
    assert!(err.to_string().contains("tokenizer"), "{err}");
}

#[test]
fn aborting_requests_waiting_for_their_grammar_frees_everything() {
    let e = engine_with_tokenizer("{}");
    let mut streams = Vec::new();
    for i in 0..6 {
        // Distinct grammars, so each one compiles (none comes from the cache).
        let params = format!(r#"{{"max_new_tokens": 8, "regex": "[a-c]{{{i},9}}"}}"#);
        streams.push(e.submit(constrained(&format!("a{i}"), &params)).unwrap());
        e.abort(&format!("a{i}"));
    }
    for stream in streams {
        let (_, out) = collect(stream);
        assert!(out.finished.is_some());
    }
    assert_eq!(e.stats().grammar_waiting_requests, 0);
    assert_drained(&e);
}

#[test]
fn recursive_references_that_llguidance_would_intersect_compile() {
    // Shapes of the WashingtonPost ANS schemas: a `type` beside `anyOf` over recursive
    // references, and a named property under a catch-all `patternProperties` key.
    let schema = r##"{"$schema": "http://json-schema.org/draft-04/schema", "$ref": "#/definitions/content",
        "definitions": {
            "content": {"type": "object", "properties": {"related": {"$ref": "#/definitions/related"}, "kind": {"enum": ["story"]}}},
            "redirect": {"type": "object", "properties": {"kind": {"enum": ["redirect"]}}},
            "related": {"type": "object", "additionalProperties": {},
                "properties": {"redirect": {"type": "array", "items": {"$ref": "#/definitions/redirect"}}},
                "patternProperties": {".*": {"type": "array", "items": {"type": "object", "anyOf": [{"$ref": "#/definitions/content"}, {"$ref": "#/definitions/redirect"}]}}}}}}"##;
    backend(false).compile(&GrammarSource::JsonSchema(schema.into())).unwrap();
}
