//! Structured output: grammars that decide which tokens a request may sample.
//!
//! A [`GrammarBackend`] compiles a [`GrammarSource`] into a [`Grammar`], a matcher that fills a
//! token bitmask, follows the tokens the request commits, rolls back, and says which tokens the
//! grammar forces next (jump-forward). [`GrammarService`] puts a cache of compiled grammars and
//! compile threads in front of a backend, so the engine thread never compiles; [`Constraint`]
//! is one request's grammar state. JSON schemas go through [`schema_policy`] first: what
//! llguidance cannot enforce is rewritten, dropped or refused (strict mode).

mod constraint;
mod llg;
mod schema_policy;
mod service;

pub(crate) use constraint::Constraint;
pub use llg::LlgBackend;
pub use schema_policy::{refuse_relaxed, relax, relaxations_of, relaxed_schema, Relaxation};
pub use service::{GrammarService, GrammarStats};

use crate::error::{invalid, EngineError, Result};
use serde::{Deserialize, Serialize};

/// The error of a constrained request on an engine started without a tokenizer.
pub(crate) fn needs_tokenizer() -> EngineError {
    invalid("structured output (regex, json_schema, ebnf, choices) needs the tokenizer; this engine was started without one")
}

/// What a request's output must match.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GrammarSource {
    /// A JSON schema, as JSON text.
    JsonSchema(String),
    /// A regular expression the whole output must match.
    Regex(String),
    /// A context-free grammar in llguidance's Lark syntax (`start: ...`).
    Ebnf(String),
    /// Exactly one of these strings.
    Choices(Vec<String>),
}

impl GrammarSource {
    /// The request field the grammar came from, for error messages.
    pub fn field(&self) -> &'static str {
        match self {
            GrammarSource::JsonSchema(_) => "json_schema",
            GrammarSource::Regex(_) => "regex",
            GrammarSource::Ebnf(_) => "ebnf",
            GrammarSource::Choices(_) => "choices",
        }
    }
}

/// Compiles grammars for one tokenizer.
pub trait GrammarBackend: Send + Sync {
    /// A matcher at the start of `source`'s language; an invalid grammar is an
    /// [`crate::EngineError::InvalidRequest`] carrying the backend's message.
    fn compile(&self, source: &GrammarSource) -> Result<Box<dyn Grammar>>;

    /// Whether [`Grammar::forced_tokens`] can return anything (it needs the tokenizer's own,
    /// canonical tokenization of forced text).
    fn can_jump_forward(&self) -> bool;
}

/// One request's position in a grammar.
pub trait Grammar: Send {
    /// Sets bit `t % 32` of word `t / 32` of `mask` for every token `t` allowed next (EOS
    /// included when the output may end here, alone once the grammar is finished) and clears
    /// the others.
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<()>;

    /// Whether `token` may come next (without committing it): a check on one token, far
    /// cheaper than a mask.
    fn allows(&mut self, token: u32) -> Result<bool> {
        Ok(self.allowed_prefix(&[token])? == 1)
    }

    /// How many of `tokens`' first tokens may come next, one after the other (none committed).
    fn allowed_prefix(&mut self, tokens: &[u32]) -> Result<usize>;

    /// Advances past `token`; an error when the grammar does not allow it.
    fn commit(&mut self, token: u32) -> Result<()>;

    /// Undoes the last `tokens` commits.
    fn rollback(&mut self, tokens: usize) -> Result<()>;

    /// The tokens of the text the grammar forces next (empty when there is a choice), not yet
    /// committed. The tokenization is the tokenizer's own over the previous token and the
    /// forced text, so no token at the boundary is split the model would not have split.
    fn forced_tokens(&mut self) -> Vec<u32>;

    /// The grammar allows nothing more: the output is complete.
    fn is_finished(&self) -> bool;

    /// An independent copy in the same state (a compiled grammar in the cache hands out forks).
    fn fork(&self) -> Box<dyn Grammar>;
}
