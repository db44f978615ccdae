//! `rsgl-bench grammar`: what structured output costs on a real tokenizer. Every JSON schema and
//! regex of the data files is compiled through the engine's grammar backend (llguidance), then
//! walked along its example token by token, as a constrained request is decoded: each step fills
//! the token mask (timed) and commits the token, which the mask must allow; EOS must be allowed
//! at the end.
//!
//! An example the mask refuses is a bug in the data or in the backend: it is reported and counted
//! against the targets, and that grammar is measured along a seeded random walk instead.

use crate::args::Args;
use crate::report::{host_info, print_table, write_json};
use rsgl_engine::grammar::{Grammar, GrammarBackend, GrammarSource, LlgBackend};
use rsgl_engine::sample::Rng;
use rsgl_engine::Tokenizer;
use serde::Serialize;
use serde_json::{json, Value};
use std::io;
use std::sync::Arc;
use std::time::Instant;

const DEFAULT_SCHEMAS: &str = "tests/data/structured/schemas.json";
const DEFAULT_REGEXES: &str = "tests/data/structured/regexes.json";
/// In order of preference: a chat model ends its turn with `<|im_end|>`.
const EOS_CANDIDATES: [&str; 3] = ["<|im_end|>", "</s>", "<|endoftext|>"];
const MASK_P50_TARGET_US: f64 = 50.0;
const MASK_P99_TARGET_US: f64 = 1000.0;
const COMPILE_P50_TARGET_MS: f64 = 5.0;
/// A random walk through an unbounded string may never draw EOS.
const RANDOM_WALK_MAX_TOKENS: usize = 256;
const SEED: u64 = 0;

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    JsonSchema,
    Regex,
}

impl Kind {
    fn label(self) -> &'static str {
        match self {
            Kind::JsonSchema => "json schema",
            Kind::Regex => "regex",
        }
    }

    /// The data file's field holding the grammar.
    fn field(self) -> &'static str {
        match self {
            Kind::JsonSchema => "schema",
            Kind::Regex => "pattern",
        }
    }
}

/// One grammar of a data file, and its example as the model would write it.
struct Case {
    name: String,
    kind: Kind,
    source: GrammarSource,
    example: String,
}

/// Reads a JSON list of `{"name", "description", "schema" | "pattern", "example"}`.
fn load_cases(path: &str, kind: Kind) -> Result<Vec<Case>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {path}: {e}"))?;
    let entries: Vec<Value> = serde_json::from_str(&text).map_err(|e| format!("{path} is not a JSON list: {e}"))?;
    if entries.is_empty() {
        return Err(format!("{path} holds no grammars"));
    }
    entries
        .iter()
        .enumerate()
        .map(|(i, entry)| {
            let name = entry["name"].as_str().map_or_else(|| format!("#{i}"), String::from);
            // `null` is a valid JSON example: only a missing one is an error.
            let (grammar, example) = (&entry[kind.field()], entry.get("example"));
            let (source, example) = match (kind, grammar, example) {
                (Kind::JsonSchema, Value::Object(_) | Value::Bool(_), Some(example)) => (GrammarSource::JsonSchema(grammar.to_string()), python_json(example)),
                (Kind::Regex, Value::String(pattern), Some(Value::String(example))) => (GrammarSource::Regex(pattern.clone()), example.clone()),
                _ => return Err(format!("{path}: {name} needs a {:?} and an example", kind.field())),
            };
            Ok(Case { name, kind, source, example })
        })
        .collect()
}

/// The separators of Python's `json.dumps`, `", "` and `": "`, and no other whitespace: the
/// layout the grammar enforces (JSON_LAYOUT in the engine's grammar/llg.rs).
struct PythonSeparators;

impl serde_json::ser::Formatter for PythonSeparators {
    fn begin_array_value<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_key<W: ?Sized + io::Write>(&mut self, writer: &mut W, first: bool) -> io::Result<()> {
        if first {
            Ok(())
        } else {
            writer.write_all(b", ")
        }
    }

    fn begin_object_value<W: ?Sized + io::Write>(&mut self, writer: &mut W) -> io::Result<()> {
        writer.write_all(b": ")
    }
}

fn python_json(value: &Value) -> String {
    let mut out = Vec::new();
    value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, PythonSeparators)).expect("JSON values always serialize");
    String::from_utf8(out).expect("serde_json writes UTF-8")
}

/// The first of [`EOS_CANDIDATES`] the tokenizer has, and its id.
fn eos_token(token_id: impl Fn(&str) -> Option<u32>) -> Result<(&'static str, u32), String> {
    EOS_CANDIDATES
        .iter()
        .find_map(|&text| token_id(text).map(|id| (text, id)))
        .ok_or_else(|| format!("the tokenizer has none of the end-of-sequence tokens {EOS_CANDIDATES:?}"))
}

/// One step's token mask, one bit per token.
struct Mask {
    words: Vec<u32>,
    vocab: usize,
}

impl Mask {
    fn new(vocab: usize) -> Mask {
        Mask { words: vec![0; vocab.div_ceil(32)], vocab }
    }

    /// Fills the mask for the grammar's next token; returns the seconds it took.
    fn fill(&mut self, grammar: &mut dyn Grammar) -> Result<f64, String> {
        let start = Instant::now();
        grammar.fill_mask(&mut self.words).map_err(|e| e.to_string())?;
        Ok(start.elapsed().as_secs_f64())
    }

    fn allows(&self, token: u32) -> bool {
        self.words[token as usize / 32] >> (token % 32) & 1 == 1
    }

    fn allowed(&self) -> Vec<u32> {
        (0..self.vocab as u32).filter(|&t| self.allows(t)).collect()
    }
}

enum ExampleWalk {
    /// The mask times of every step, EOS's included.
    Followed(Vec<f64>),
    /// The index of the first token the mask refused (the token count when it was EOS).
    Refused(usize),
}

fn follow_example(grammar: &mut dyn Grammar, tokens: &[u32], eos: u32, mask: &mut Mask) -> Result<ExampleWalk, String> {
    let mut seconds = Vec::with_capacity(tokens.len() + 1);
    for (position, &token) in tokens.iter().enumerate() {
        if grammar.is_finished() {
            return Ok(ExampleWalk::Refused(position));
        }
        seconds.push(mask.fill(grammar)?);
        if !mask.allows(token) {
            return Ok(ExampleWalk::Refused(position));
        }
        grammar.commit(token).map_err(|e| format!("the mask allowed token {token} but the grammar refused it: {e}"))?;
    }
    // A finished grammar ends the request as EOS would; otherwise EOS must be allowed now.
    if !grammar.is_finished() {
        seconds.push(mask.fill(grammar)?);
        if !mask.allows(eos) {
            return Ok(ExampleWalk::Refused(tokens.len()));
        }
    }
    Ok(ExampleWalk::Followed(seconds))
}

/// The mask times along a path of tokens drawn uniformly from each mask, until EOS is drawn,
/// the grammar finishes or the walk reaches [`RANDOM_WALK_MAX_TOKENS`].
fn random_walk(grammar: &mut dyn Grammar, eos: u32, mask: &mut Mask, rng: &mut Rng) -> Result<Vec<f64>, String> {
    let mut seconds = Vec::new();
    while seconds.len() < RANDOM_WALK_MAX_TOKENS && !grammar.is_finished() {
        seconds.push(mask.fill(grammar)?);
        let allowed = mask.allowed();
        if allowed.is_empty() {
            return Err("the mask allows no token, not even EOS".into());
        }
        let token = allowed[(rng.next_u64() % allowed.len() as u64) as usize];
        if token == eos {
            break;
        }
        grammar.commit(token).map_err(|e| format!("the mask allowed token {token} but the grammar refused it: {e}"))?;
    }
    Ok(seconds)
}

/// Where the mask first refused a grammar's example.
struct Refusal {
    position: usize,
    example_tokens: usize,
    token: String,
}

struct GrammarResult {
    name: String,
    kind: Kind,
    compile_seconds: f64,
    mask_seconds: Vec<f64>,
    refusal: Option<Refusal>,
}

impl GrammarResult {
    fn json(&self) -> Value {
        json!({
            "name": self.name,
            "kind": self.kind.label(),
            "compile_ms": self.compile_seconds * 1e3,
            "tokens": self.mask_seconds.len(),
            "mask_us": Percentiles::of(&self.mask_seconds).json(1e6),
            "walk": if self.refusal.is_some() { "random" } else { "example" },
            "refused": self.refusal.as_ref().map(|r| json!({ "position": r.position, "example_tokens": r.example_tokens, "token": r.token })),
        })
    }
}

struct Walker<'a> {
    backend: &'a LlgBackend,
    tokenizer: &'a Tokenizer,
    eos: u32,
    mask: Mask,
    rng: Rng,
}

impl Walker<'_> {
    fn compile(&self, case: &Case) -> Result<(Box<dyn Grammar>, f64), String> {
        let start = Instant::now();
        let compiled = self.backend.compile(&case.source);
        let seconds = start.elapsed().as_secs_f64();
        Ok((compiled.map_err(|e| e.to_string())?, seconds))
    }

    fn measure(&mut self, case: &Case) -> Result<GrammarResult, String> {
        let (mut grammar, compile_seconds) = self.compile(case)?;
        let tokens = self.tokenizer.encode(&case.example, false).map_err(|e| format!("cannot tokenize the example: {e}"))?;
        let (mask_seconds, refusal) = match follow_example(&mut *grammar, &tokens, self.eos, &mut self.mask)? {
            ExampleWalk::Followed(seconds) => (seconds, None),
            ExampleWalk::Refused(position) => {
                let token =
                    tokens.get(position).map_or_else(|| "EOS".into(), |&t| String::from_utf8_lossy(self.tokenizer.table().bytes(t, false)).into_owned());
                let (mut fresh, _) = self.compile(case)?;
                let seconds = random_walk(&mut *fresh, self.eos, &mut self.mask, &mut self.rng)?;
                (seconds, Some(Refusal { position, example_tokens: tokens.len(), token }))
            }
        };
        Ok(GrammarResult { name: case.name.clone(), kind: case.kind, compile_seconds, mask_seconds, refusal })
    }
}

/// p50, p99 and max (nearest rank) of durations in seconds; NaN without samples.
struct Percentiles {
    p50: f64,
    p99: f64,
    max: f64,
}

impl Percentiles {
    fn of(samples: &[f64]) -> Percentiles {
        let mut sorted = samples.to_vec();
        sorted.sort_by(f64::total_cmp);
        Percentiles { p50: nearest_rank(&sorted, 50), p99: nearest_rank(&sorted, 99), max: nearest_rank(&sorted, 100) }
    }

    /// The three in `per_second` units (1e3: ms, 1e6: us).
    fn cells(&self, per_second: f64, decimals: usize) -> [String; 3] {
        [self.p50, self.p99, self.max].map(|s| format!("{:.decimals$}", s * per_second))
    }

    fn json(&self, per_second: f64) -> Value {
        json!({ "p50": self.p50 * per_second, "p99": self.p99 * per_second, "max": self.max * per_second })
    }
}

/// The smallest sample with at least `percent`% of the samples at or below it.
fn nearest_rank(sorted: &[f64], percent: usize) -> f64 {
    let rank = (percent * sorted.len()).div_ceil(100).max(1);
    sorted.get(rank - 1).copied().unwrap_or(f64::NAN)
}

/// The grammars of one kind, or all of them.
struct GroupStats {
    label: &'static str,
    grammars: usize,
    compile: Percentiles,
    mask: Percentiles,
    tokens: usize,
    refused: usize,
}

impl GroupStats {
    fn of(label: &'static str, results: &[&GrammarResult]) -> GroupStats {
        let compile: Vec<f64> = results.iter().map(|r| r.compile_seconds).collect();
        let mask: Vec<f64> = results.iter().flat_map(|r| r.mask_seconds.iter().copied()).collect();
        GroupStats {
            label,
            grammars: results.len(),
            compile: Percentiles::of(&compile),
            mask: Percentiles::of(&mask),
            tokens: mask.len(),
            refused: results.iter().filter(|r| r.refusal.is_some()).count(),
        }
    }

    fn row(&self) -> Vec<String> {
        let mut row = vec![self.label.to_string(), self.grammars.to_string()];
        row.extend(self.compile.cells(1e3, 2));
        row.push(self.tokens.to_string());
        row.extend(self.mask.cells(1e6, 1));
        row.push(self.refused.to_string());
        row
    }

    fn json(&self) -> Value {
        json!({
            "grammars": self.label,
            "count": self.grammars,
            "compile_ms": self.compile.json(1e3),
            "tokens": self.tokens,
            "mask_us": self.mask.json(1e6),
            "examples_refused": self.refused,
        })
    }
}

/// A limit the measured value must not exceed.
struct Target {
    metric: &'static str,
    measured: f64,
    limit: f64,
    decimals: usize,
}

impl Target {
    fn pass(&self) -> bool {
        self.measured <= self.limit
    }

    fn row(&self) -> Vec<String> {
        let verdict = if self.pass() { "pass" } else { "FAIL" };
        vec![self.metric.to_string(), format!("{:.*}", self.decimals, self.measured), format!("<= {}", self.limit), verdict.to_string()]
    }

    fn json(&self) -> Value {
        json!({ "metric": self.metric, "measured": self.measured, "limit": self.limit, "pass": self.pass() })
    }
}

pub fn run(mut args: Args) -> Result<(), String> {
    let tokenizer_path = args.string("tokenizer").ok_or("--tokenizer PATH/tokenizer.json is required")?;
    let schemas_path = args.string("schemas").unwrap_or_else(|| DEFAULT_SCHEMAS.into());
    let regexes_path = args.string("regexes").unwrap_or_else(|| DEFAULT_REGEXES.into());
    let json_path = args.string("json");
    args.finish()?;

    let mut cases = load_cases(&schemas_path, Kind::JsonSchema)?;
    cases.extend(load_cases(&regexes_path, Kind::Regex)?);
    let tokenizer_text = std::fs::read_to_string(&tokenizer_path).map_err(|e| format!("cannot read {tokenizer_path}: {e}"))?;
    let tokenizer = Arc::new(Tokenizer::from_json(&tokenizer_text, None).map_err(|e| format!("{tokenizer_path}: {e}"))?);
    let table = tokenizer.table();
    let (eos_text, eos) = eos_token(|text| tokenizer.token_to_id(text))?;

    let started = Instant::now();
    let backend = LlgBackend::new(tokenizer.clone(), &[eos]).map_err(|e| e.to_string())?;
    let backend_seconds = started.elapsed().as_secs_f64();
    println!(
        "rsgl-bench grammar: {tokenizer_path} ({} tokens, EOS {eos_text} = {eos}), backend built in {:.1} ms (forced text tokenized canonically: {}), {} grammars",
        table.len(),
        backend_seconds * 1e3,
        backend.can_jump_forward(),
        cases.len()
    );

    let mut walker = Walker { backend: &backend, tokenizer: &tokenizer, eos, mask: Mask::new(table.len()), rng: Rng::new(SEED) };
    let results =
        cases.iter().map(|case| walker.measure(case).map_err(|e| format!("{} {}: {e}", case.kind.label(), case.name))).collect::<Result<Vec<_>, _>>()?;

    let of_kind = |kind: Kind| results.iter().filter(|r| r.kind == kind).collect::<Vec<_>>();
    let groups = [
        GroupStats::of(Kind::JsonSchema.label(), &of_kind(Kind::JsonSchema)),
        GroupStats::of(Kind::Regex.label(), &of_kind(Kind::Regex)),
        GroupStats::of("all", &results.iter().collect::<Vec<_>>()),
    ];
    let all = &groups[2];
    let targets = [
        Target { metric: "mask p50 (us)", measured: all.mask.p50 * 1e6, limit: MASK_P50_TARGET_US, decimals: 1 },
        Target { metric: "mask p99 (us)", measured: all.mask.p99 * 1e6, limit: MASK_P99_TARGET_US, decimals: 1 },
        Target { metric: "compile p50 (ms)", measured: all.compile.p50 * 1e3, limit: COMPILE_P50_TARGET_MS, decimals: 2 },
        Target { metric: "examples refused", measured: all.refused as f64, limit: 0.0, decimals: 0 },
    ];

    let headers = ["grammars", "count", "compile p50 ms", "p99 ms", "max ms", "tokens", "mask p50 us", "p99 us", "max us", "refused"];
    print_table(&headers, &groups.iter().map(GroupStats::row).collect::<Vec<_>>());
    println!();
    print_table(&["target", "measured", "limit", "result"], &targets.iter().map(Target::row).collect::<Vec<_>>());
    for r in &results {
        if let Some(refusal) = &r.refusal {
            println!(
                "{} {}: the mask refused token {} of the example's {} ({:?}); measured on a random walk instead",
                r.kind.label(),
                r.name,
                refusal.position,
                refusal.example_tokens,
                refusal.token
            );
        }
    }

    if let Some(path) = json_path {
        let report = json!({
            "bench": "grammar",
            "host": host_info(),
            "tokenizer": tokenizer_path,
            "vocab_size": table.len(),
            "eos": { "token": eos_text, "id": eos },
            "backend_seconds": backend_seconds,
            "canonical_tokenizer": backend.can_jump_forward(),
            "schemas": schemas_path,
            "regexes": regexes_path,
            "random_walk": { "seed": SEED, "max_tokens": RANDOM_WALK_MAX_TOKENS },
            "groups": groups.iter().map(GroupStats::json).collect::<Vec<_>>(),
            "targets": targets.iter().map(Target::json).collect::<Vec<_>>(),
            "results": results.iter().map(GrammarResult::json).collect::<Vec<_>>(),
        });
        write_json(&path, &report)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::{eos_token, nearest_rank, python_json, Percentiles};
    use std::collections::HashMap;

    #[test]
    fn percentiles_are_nearest_ranks() {
        let samples: Vec<f64> = (1..=200).rev().map(f64::from).collect();
        let p = Percentiles::of(&samples);
        assert_eq!((p.p50, p.p99, p.max), (100.0, 198.0, 200.0));
        assert_eq!(nearest_rank(&[7.0], 50), 7.0);
        assert!(nearest_rank(&[], 50).is_nan());
    }

    #[test]
    fn eos_prefers_the_chat_turn_end() {
        let vocab = HashMap::from([("</s>", 2), ("<|endoftext|>", 0), ("<|im_end|>", 5)]);
        assert_eq!(eos_token(|t| vocab.get(t).copied()), Ok(("<|im_end|>", 5)));
        assert_eq!(eos_token(|t| vocab.get(t).copied().filter(|&id| id != 5)), Ok(("</s>", 2)));
        assert!(eos_token(|_| None).is_err());
    }

    #[test]
    fn json_is_written_with_pythons_separators() {
        let value = serde_json::json!({"b": [1, {"c": null}], "a": "x, y: z", "e": {}});
        assert_eq!(python_json(&value), r#"{"b": [1, {"c": null}], "a": "x, y: z", "e": {}}"#);
    }
}
