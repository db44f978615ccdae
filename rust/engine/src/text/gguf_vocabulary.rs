//! The tokenizer a GGUF file's `tokenizer.ggml.*` metadata describes, built as llama.cpp (and
//! transformers' GGUF loader) builds it: byte-level BPE (`gpt2`) split as its `pre` names, or
//! SentencePiece BPE (`llama`) with its merges listed or drawn from its scores; control and
//! user-defined tokens are matched whole in text instead of being cut up.

use super::tokenizer::{byte_alphabet, byte_of_char};
use crate::error::{EngineError, Result};
use serde_json::{Map, Value};
use std::collections::HashMap;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

/// llama.cpp's token types (`gguf.TokenType`).
const CONTROL: u64 = 3;
const USER_DEFINED: u64 = 4;
const SENTENCEPIECE_SPACE: char = '\u{2581}';

/// How text is split before byte-level BPE, by `tokenizer.ggml.pre` (llama.cpp's llama-vocab.cpp).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's: Qwen2's with combining marks (`\p{M}`) in the runs of letters.
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const SPLIT_BY_PRE: &[(&str, &str)] = &[
    ("llama-bpe", LLAMA3_SPLIT),
    ("llama3", LLAMA3_SPLIT),
    ("llama-v3", LLAMA3_SPLIT),
    ("qwen2", QWEN2_SPLIT),
    ("qwen35", QWEN35_SPLIT),
    ("deepseek-r1-qwen", QWEN2_SPLIT),
];
/// These split every digit apart, then apply GPT-2's pattern.
const DIGITS_THEN_GPT2_PRE: &[&str] = &["smollm", "starcoder"];

/// The tokenizer of a GGUF file whose metadata is `metadata`; None for a file without a vocabulary.
pub(super) fn tokenizer_from_gguf(metadata: &Map<String, Value>) -> Result<Option<tokenizers::Tokenizer>> {
    let Some(tokens) = strings(metadata, "tokenizer.ggml.tokens")? else { return Ok(None) };
    let model = metadata.get("tokenizer.ggml.model").and_then(Value::as_str).unwrap_or("none");
    let merges = strings(metadata, "tokenizer.ggml.merges")?.map(|merges| merges.iter().map(|merge| merge_pair(merge)).collect::<Vec<_>>());
    let mut tokenizer = match model {
        "gpt2" => byte_level_bpe(&tokens, merges, metadata.get("tokenizer.ggml.pre").and_then(Value::as_str))?,
        "llama" => sentencepiece_bpe(&tokens, merges, metadata)?,
        other => {
            return Err(EngineError::UnsupportedModel(format!(
                "this GGUF file's tokenizer is of type '{other}'; rsgl supports 'gpt2' (byte-level BPE) and 'llama' (SentencePiece BPE). \
                 Use another model, or load it with skip_tokenizer_init=True."
            )))
        }
    };
    add_whole_tokens(&mut tokenizer, &tokens, metadata);
    Ok(Some(tokenizer))
}

/// The strings of the metadata array `key`, if the file has it.
fn strings(metadata: &Map<String, Value>, key: &str) -> Result<Option<Vec<String>>> {
    let Some(value) = metadata.get(key) else { return Ok(None) };
    let texts = value.as_array().and_then(|items| items.iter().map(|item| item.as_str().map(str::to_string)).collect::<Option<Vec<_>>>());
    texts.map(Some).ok_or_else(|| broken(&format!("its {key} is not a list of strings")))
}

fn broken(what: &str) -> EngineError {
    EngineError::ModelLoad(format!("this GGUF file's tokenizer looks broken: {what}; download the file again"))
}

fn merge_pair(merge: &str) -> (String, String) {
    let (left, right) = merge.split_once(' ').unwrap_or((merge, ""));
    (left.to_string(), right.to_string())
}

fn bpe(vocab: Vocab, merges: Vec<(String, String)>, sentencepiece: Option<Option<String>>) -> Result<tokenizers::Tokenizer> {
    let builder = BPE::builder().vocab_and_merges(vocab, merges);
    let builder = match sentencepiece {
        // SentencePiece: unknown pieces fall back to their bytes; runs of unknowns fuse.
        Some(unknown) => {
            let builder = builder.fuse_unk(true).byte_fallback(true);
            match unknown {
                Some(unknown) => builder.unk_token(unknown),
                None => builder,
            }
        }
        None => builder,
    };
    let model = builder.build().map_err(|e| broken(&format!("its vocabulary and merges do not make a BPE model ({e})")))?;
    Ok(tokenizers::Tokenizer::new(model))
}

fn byte_level_bpe(tokens: &[String], merges: Option<Vec<(String, String)>>, pre: Option<&str>) -> Result<tokenizers::Tokenizer> {
    let merges = merges.ok_or_else(|| broken("a byte-level BPE vocabulary without tokenizer.ggml.merges"))?;
    let alphabet = byte_of_char();
    // A few files store a token as plain text (e.g. with a real space): respell it in the byte alphabet.
    let vocab = tokens
        .iter()
        .enumerate()
        .map(|(id, token)| {
            let spelled = if token.chars().all(|c| alphabet.contains_key(&c)) { token.clone() } else { byte_level_spelling(token) };
            (spelled, id as u32)
        })
        .collect();
    let mut tokenizer = bpe(vocab, merges, None)?;
    tokenizer.with_pre_tokenizer(Some(byte_level_pre_tokenizer(pre)?));
    tokenizer.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
    Ok(tokenizer)
}

/// `text`'s UTF-8 bytes in GPT-2's byte alphabet.
fn byte_level_spelling(text: &str) -> String {
    let alphabet = byte_alphabet();
    text.bytes().map(|byte| alphabet[byte as usize]).collect()
}

fn byte_level_pre_tokenizer(pre: Option<&str>) -> Result<PreTokenizerWrapper> {
    let split = SPLIT_BY_PRE.iter().find(|(name, _)| Some(*name) == pre).map(|(_, pattern)| *pattern);
    if let Some(pattern) = split {
        let split = Split::new(SplitPattern::Regex(pattern.to_string()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| EngineError::ModelLoad(format!("cannot build the '{}' pre-tokenizer: {e}", pre.unwrap_or_default())))?;
        return Ok(PreTokenizerSequence::new(vec![split.into(), ByteLevel::new(false, true, false).into()]).into());
    }
    let gpt2: PreTokenizerWrapper = ByteLevel::new(false, true, true).into();
    if pre.is_some_and(|pre| DIGITS_THEN_GPT2_PRE.contains(&pre)) {
        return Ok(PreTokenizerSequence::new(vec![Digits::new(true).into(), gpt2]).into());
    }
    Ok(gpt2) // "default", "gpt-2" and names we do not know: GPT-2's own pattern
}

fn sentencepiece_bpe(tokens: &[String], merges: Option<Vec<(String, String)>>, metadata: &Map<String, Value>) -> Result<tokenizers::Tokenizer> {
    let merges = match merges {
        Some(merges) => merges,
        None => {
            let scores = metadata
                .get("tokenizer.ggml.scores")
                .and_then(Value::as_array)
                .map(|scores| scores.iter().map(|s| s.as_f64().unwrap_or(0.0)).collect::<Vec<_>>());
            merges_from_scores(tokens, &scores.ok_or_else(|| broken("a SentencePiece vocabulary with neither merges nor scores"))?)
        }
    };
    let unknown = token_id(metadata, "unknown").and_then(|id| tokens.get(id as usize)).cloned();
    let vocab = tokens.iter().enumerate().map(|(id, token)| (token.clone(), id as u32)).collect();
    let mut tokenizer = bpe(vocab, merges, Some(unknown))?;
    let add_space_prefix = metadata.get("tokenizer.ggml.add_space_prefix").and_then(Value::as_bool).unwrap_or(true);
    let prepend = if add_space_prefix { PrependScheme::First } else { PrependScheme::Never };
    tokenizer.with_pre_tokenizer(Some(Metaspace::new(SENTENCEPIECE_SPACE, prepend, false)));
    let replace = Replace::new(SENTENCEPIECE_SPACE.to_string(), " ").expect("a plain string pattern");
    let mut steps = vec![DecoderWrapper::Replace(replace), DecoderWrapper::ByteFallback(ByteFallback::new()), DecoderWrapper::Fuse(Fuse::new())];
    if add_space_prefix {
        steps.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0))); // the space the pre-tokenizer prepended
    }
    tokenizer.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(steps))));
    Ok(tokenizer)
}

/// SentencePiece files list no merges: every token that splits into two known tokens is one,
/// ranked by the token's score (best first, then the longer left and right parts), as llama.cpp
/// and transformers do it.
fn merges_from_scores(tokens: &[String], scores: &[f64]) -> Vec<(String, String)> {
    let mut index: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    for (position, token) in tokens.iter().enumerate() {
        index.entry(token.as_str()).or_insert(position);
    }
    // A token listed twice counts once, with its last score.
    let mut score_of: HashMap<&str, f64> = HashMap::with_capacity(tokens.len());
    let mut order = Vec::with_capacity(tokens.len());
    for (token, &score) in tokens.iter().zip(scores) {
        if score_of.insert(token.as_str(), score).is_none() {
            order.push(token.as_str());
        }
    }
    let mut ranked: Vec<(&str, &str, f64)> = Vec::new();
    for token in order {
        let mut known: Vec<(&str, &str)> = token
            .char_indices()
            .skip(1)
            .map(|(cut, _)| token.split_at(cut))
            .filter(|(left, right)| index.contains_key(left) && index.contains_key(right))
            .collect();
        known.sort_by_key(|(left, right)| (index[left], index[right]));
        ranked.extend(known.into_iter().map(|(left, right)| (left, right, score_of[token])));
    }
    let key = |(left, right, score): &(&str, &str, f64)| (*score, left.chars().count(), right.chars().count());
    ranked.sort_by(|a, b| key(b).partial_cmp(&key(a)).unwrap_or(std::cmp::Ordering::Equal));
    ranked.into_iter().map(|(left, right, _)| (left.to_string(), right.to_string())).collect()
}

fn token_id(metadata: &Map<String, Value>, role: &str) -> Option<u32> {
    metadata.get(&format!("tokenizer.ggml.{role}_token_id")).and_then(Value::as_u64).map(|id| id as u32)
}

/// Control and user-defined tokens (and the bos / eos / eot / unknown / padding ids, special
/// even when not typed control) matched whole, as llama.cpp does.
fn add_whole_tokens(tokenizer: &mut tokenizers::Tokenizer, tokens: &[String], metadata: &Map<String, Value>) {
    let special_ids: Vec<u32> = ["bos", "eos", "eot", "unknown", "padding"].iter().filter_map(|role| token_id(metadata, role)).collect();
    let types = metadata.get("tokenizer.ggml.token_type").and_then(Value::as_array);
    let (mut special, mut plain) = (Vec::new(), Vec::new());
    for (id, token) in tokens.iter().enumerate() {
        // A token the model's vocabulary spells differently would get a new id: leave those alone.
        if tokenizer.token_to_id(token) != Some(id as u32) {
            continue;
        }
        let kind = types.and_then(|types| types.get(id)).and_then(Value::as_u64);
        if kind == Some(CONTROL) || special_ids.contains(&(id as u32)) {
            special.push(AddedToken::from(token.clone(), true).normalized(false));
        } else if kind == Some(USER_DEFINED) {
            plain.push(AddedToken::from(token.clone(), false).normalized(false));
        }
    }
    tokenizer.add_special_tokens(&special);
    tokenizer.add_tokens(&plain);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn metadata(value: Value) -> Map<String, Value> {
        value.as_object().expect("an object").clone()
    }

    #[test]
    fn merges_from_scores_rank_by_score_then_longer_parts() {
        let tokens: Vec<String> = ["a", "b", "ab", "abb", "bb", "ba"].map(String::from).to_vec();
        let merges = merges_from_scores(&tokens, &[0.0, 0.0, -1.0, -3.0, -1.0, -2.0]);
        let pairs: Vec<(&str, &str)> = merges.iter().map(|(l, r)| (l.as_str(), r.as_str())).collect();
        // "ab" and "bb" tie on score and lengths: listed order; "abb" ranks last by its score,
        // its two splits the longer left part first.
        assert_eq!(pairs, [("a", "b"), ("b", "b"), ("b", "a"), ("ab", "b"), ("a", "bb")]);
    }

    #[test]
    fn a_sentencepiece_vocabulary_encodes_whole_control_tokens_and_strips_its_space() {
        let tokens = ["<unk>", "<s>", "</s>", "\u{2581}", "a", "\u{2581}a", "<0x41>"];
        let file = metadata(json!({
            "tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": [0, 0, 0, -1, -1, -0.5, 0],
            "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 6], "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.eos_token_id": 2,
        }));
        let tokenizer = super::super::Tokenizer::from_gguf(&file, None).unwrap().unwrap();
        assert_eq!(tokenizer.encode("a a</s>", false).unwrap(), [5, 5, 2]);
        assert_eq!(tokenizer.encode("A", false).unwrap(), [3, 6], "an unknown letter falls back to its byte");
        assert_eq!(tokenizer.decode(&[5, 5, 2], true).unwrap(), "a a");
    }

    #[test]
    fn byte_level_tokens_spelled_as_text_are_respelled_and_unknown_models_refused() {
        let file = metadata(json!({
            "tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["h", "i", " ", "hi", "\u{120}hi"], "tokenizer.ggml.merges": ["h i", "\u{120} hi"],
        }));
        let tokenizer = super::super::Tokenizer::from_gguf(&file, None).unwrap().unwrap();
        assert_eq!(tokenizer.encode("hi hi", false).unwrap(), [3, 4], "the plain space reads as the byte alphabet's");
        assert!(super::super::Tokenizer::from_gguf(&metadata(json!({})), None).unwrap().is_none());
        let unknown = metadata(json!({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]}));
        assert!(matches!(super::super::Tokenizer::from_gguf(&unknown, None), Err(EngineError::UnsupportedModel(m)) if m.contains("'bert'")));
    }
}
