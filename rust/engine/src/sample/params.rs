//! Sampling parameters, named and defaulted as in SGLang's `sampling_params`.

use crate::error::{invalid, Result};
use crate::grammar::GrammarSource;
use serde::{Deserialize, Deserializer};
use std::collections::HashMap;

/// The largest bias `logit_bias` may add or take away (OpenAI's bound: ±100 bans or forces a token).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SamplingParams {
    pub max_new_tokens: usize,
    pub min_new_tokens: usize,
    /// 0 means greedy.
    pub temperature: f32,
    pub top_p: f32,
    /// -1 (or any value < 1 when written as -1) keeps every token.
    pub top_k: i64,
    pub min_p: f32,
    pub repetition_penalty: f32,
    pub frequency_penalty: f32,
    pub presence_penalty: f32,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub ignore_eos: bool,
    pub skip_special_tokens: bool,
    /// Keep the matched stop string at the end of the text.
    pub no_stop_trim: bool,
    /// Makes sampling reproducible; requests without one get a fresh seed.
    pub seed: Option<u64>,
    /// Added to the logits of these token ids before sampling (after the penalties). JSON keys
    /// are strings, so ids are read from strings as well as from integers.
    #[serde(deserialize_with = "token_id_map")]
    pub logit_bias: HashMap<u32, f32>,
    /// Structured output, at most one of these: the output matches the regular expression, is
    /// JSON valid against the schema (given as JSON text, as SGLang takes it, or as an object),
    /// follows the Lark grammar, or is one of the choices. A grammar decides when the output
    /// ends, so `min_new_tokens` does not hold EOS back in constrained requests.
    pub regex: Option<String>,
    pub json_schema: Option<serde_json::Value>,
    pub ebnf: Option<String>,
    pub choices: Option<Vec<String>>,
    /// Refuse a `json_schema` the grammar would only approximate (see `grammar::relax`)
    /// instead of accepting it with the relaxations reported.
    pub strict_json_schema: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            max_new_tokens: 128,
            min_new_tokens: 0,
            temperature: 1.0,
            top_p: 1.0,
            top_k: -1,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            skip_special_tokens: true,
            no_stop_trim: false,
            seed: None,
            logit_bias: HashMap::new(),
            regex: None,
            json_schema: None,
            ebnf: None,
            choices: None,
            strict_json_schema: false,
        }
    }
}

fn check(ok: bool, msg: &str) -> Result<()> {
    if ok {
        Ok(())
    } else {
        Err(invalid(msg))
    }
}

impl SamplingParams {
    pub fn validate(&self, vocab_size: usize) -> Result<()> {
        check(self.temperature.is_finite() && self.temperature >= 0.0, "temperature must be a finite number >= 0 (0 means greedy)")?;
        check(self.top_p > 0.0 && self.top_p <= 1.0, "top_p must be in (0, 1]")?;
        check(self.top_k == -1 || self.top_k >= 1, "top_k must be -1 (disabled) or at least 1")?;
        check((0.0..=1.0).contains(&self.min_p), "min_p must be in [0, 1]")?;
        check(self.repetition_penalty > 0.0 && self.repetition_penalty <= 2.0, "repetition_penalty must be in (0, 2]")?;
        check((-2.0..=2.0).contains(&self.frequency_penalty), "frequency_penalty must be in [-2, 2]")?;
        check((-2.0..=2.0).contains(&self.presence_penalty), "presence_penalty must be in [-2, 2]")?;
        check(self.min_new_tokens <= self.max_new_tokens, "min_new_tokens must not exceed max_new_tokens")?;
        check(self.stop.iter().all(|s| !s.is_empty()), "stop strings must not be empty")?;
        self.grammar()?;
        if let Some(bad) = self.stop_token_ids.iter().find(|&&t| t as usize >= vocab_size) {
            return Err(invalid(format!("stop_token_ids: {bad} is outside the vocabulary (size {vocab_size})")));
        }
        if let Some(bad) = self.logit_bias.keys().filter(|&&t| t as usize >= vocab_size).min() {
            return Err(invalid(format!("logit_bias: token {bad} is outside the vocabulary (size {vocab_size})")));
        }
        if let Some((token, bias)) = self.logit_bias.iter().find(|(_, b)| !(-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(*b)) {
            return Err(invalid(format!("logit_bias: the bias of token {token} is {bias}; it must be in [-100, 100]")));
        }
        Ok(())
    }

    /// The grammar the output must follow, if any.
    pub fn grammar(&self) -> Result<Option<GrammarSource>> {
        let mut specs = Vec::new();
        if let Some(rx) = &self.regex {
            specs.push(GrammarSource::Regex(rx.clone()));
        }
        if let Some(schema) = &self.json_schema {
            // SGLang sends the schema as JSON text; an object is taken as the schema itself.
            let text = match schema {
                serde_json::Value::String(text) => text.clone(),
                other => other.to_string(),
            };
            if self.strict_json_schema {
                crate::grammar::refuse_relaxed(&crate::grammar::relaxations_of(&text)?)?;
            }
            specs.push(GrammarSource::JsonSchema(text));
        }
        if let Some(grammar) = &self.ebnf {
            specs.push(GrammarSource::Ebnf(grammar.clone()));
        }
        if let Some(choices) = &self.choices {
            specs.push(GrammarSource::Choices(choices.clone()));
        }
        if specs.len() > 1 {
            let fields: Vec<&str> = specs.iter().map(GrammarSource::field).collect();
            return Err(invalid(format!("give at most one of regex, json_schema, ebnf and choices (got {})", fields.join(", "))));
        }
        Ok(specs.pop())
    }

    /// Whether sampling from all the logits and refusing tokens outside a mask draws from the
    /// same distribution as sampling from the masked logits: true for greedy and plain
    /// temperature sampling; top-k, top-p and min-p renormalize over the tokens they keep, so
    /// they must see the mask first.
    pub fn sampling_commutes_with_masks(&self, vocab_size: usize) -> bool {
        let keeps_all = (self.top_k == -1 || self.top_k as usize >= vocab_size) && self.top_p >= 1.0 && self.min_p == 0.0;
        self.is_greedy() || keeps_all
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == 1
    }
}

/// A map from token ids, written as integers or as decimal strings (JSON object keys), to
/// biases; `null` is an empty map.
fn token_id_map<'de, D: Deserializer<'de>>(deserializer: D) -> std::result::Result<HashMap<u32, f32>, D::Error> {
    #[derive(PartialEq, Eq, Hash)]
    struct TokenId(u32);

    impl<'de> Deserialize<'de> for TokenId {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
            struct Visitor;
            impl serde::de::Visitor<'_> for Visitor {
                type Value = TokenId;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a token id (an integer, or a string of digits)")
                }
                fn visit_u64<E: serde::de::Error>(self, v: u64) -> std::result::Result<TokenId, E> {
                    u32::try_from(v).map(TokenId).map_err(|_| E::custom(format!("token id {v} is out of range")))
                }
                fn visit_i64<E: serde::de::Error>(self, v: i64) -> std::result::Result<TokenId, E> {
                    u32::try_from(v).map(TokenId).map_err(|_| E::custom(format!("token id {v} is out of range")))
                }
                fn visit_str<E: serde::de::Error>(self, v: &str) -> std::result::Result<TokenId, E> {
                    v.parse().map(TokenId).map_err(|_| E::custom(format!("{v:?} is not a token id")))
                }
            }
            deserializer.deserialize_any(Visitor)
        }
    }

    let map = Option::<HashMap<TokenId, f32>>::deserialize(deserializer)?.unwrap_or_default();
    Ok(map.into_iter().map(|(TokenId(id), bias)| (id, bias)).collect())
}
