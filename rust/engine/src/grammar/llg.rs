//! The grammar backend on llguidance: an Earley parser over a lazily built lexer, with token
//! masks computed by walking the tokenizer's trie.

use super::{Grammar, GrammarBackend, GrammarSource};
use crate::error::{invalid, Result};
use crate::text::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;
use toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

pub struct LlgBackend {
    factory: ParserFactory,
    canonical: bool,
}

impl LlgBackend {
    /// Builds the token trie from the tokenizer's token table and, when the tokenizer spells
    /// pieces of text canonically, uses it to tokenize forced text.
    pub fn new(tokenizer: Arc<Tokenizer>, eos_token_ids: &[u32]) -> Result<Self> {
        let table = tokenizer.table();
        let words: Vec<Vec<u8>> = (0..table.len() as u32)
            .map(|t| {
                let bytes = table.bytes(t, false);
                if table.is_special(t) {
                    // Marked so that no grammar text can match a special token.
                    [&[TokTrie::SPECIAL_TOKEN_MARKER], bytes].concat()
                } else {
                    bytes.to_vec()
                }
            })
            .collect();
        let eos: Vec<u32> = eos_token_ids.iter().copied().filter(|&t| (t as usize) < words.len()).collect();
        if eos.is_empty() {
            return Err(invalid("structured output needs an end-of-sequence token; the model declares none"));
        }
        let trie = TokTrie::from(&TokRxInfo::new(words.len() as u32, eos[0]), &words).with_eos_tokens(&eos);
        let env: TokEnv =
            if tokenizes_canonically(&trie, tokenizer.hf()) { Arc::new(ModelTokenizer { trie, tokenizer }) } else { Arc::new(ApproximateTokEnv::new(trie)) };
        let canonical = env.tokenize_is_canonical();
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| invalid(format!("cannot set up the grammar backend: {e}")))?;
        factory.quiet();
        Ok(LlgBackend { factory, canonical })
    }
}

impl GrammarBackend for LlgBackend {
    fn compile(&self, source: &GrammarSource) -> Result<Box<dyn Grammar>> {
        let field = source.field();
        let grammar = top_level_grammar(source).map_err(|e| invalid(format!("{field}: {e}")))?;
        let parser = self.factory.create_parser(grammar).map_err(|e| invalid(format!("{field}: {e}")))?;
        Ok(Box::new(LlgGrammar(Matcher::new(Ok(parser)))))
    }

    fn can_jump_forward(&self) -> bool {
        self.canonical
    }
}

/// JSON is written compactly with one space after `:` and `,` (as Python's `json.dumps`), and
/// no free whitespace: a model cannot pad the output forever, and every key is forced text.
const JSON_LAYOUT: &str = r#"{"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}"#;

fn top_level_grammar(source: &GrammarSource) -> std::result::Result<TopLevelGrammar, String> {
    Ok(match source {
        GrammarSource::JsonSchema(text) => {
            let mut schema: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
            // The relaxations are reported where the request is read (`relaxations_of`).
            super::relax(&mut schema);
            if let Some(object) = schema.as_object_mut() {
                object.entry("x-guidance").or_insert_with(|| serde_json::from_str(JSON_LAYOUT).expect("valid JSON"));
            } else if !schema.is_boolean() {
                return Err("a JSON schema must be an object or a boolean".into());
            }
            TopLevelGrammar::from_json_schema(schema)
        }
        GrammarSource::Regex(rx) => TopLevelGrammar::from_regex(rx),
        GrammarSource::Ebnf(lark) => {
            if lark.contains("::=") {
                return Err("rsgl's grammar backend (llguidance) takes Lark syntax (`start: \"a\" | b`), not GBNF (`root ::= ...`)".into());
            }
            TopLevelGrammar::from_lark(lark.clone())
        }
        GrammarSource::Choices(choices) => {
            if choices.is_empty() {
                return Err("give at least one choice".into());
            }
            let quoted: Vec<String> = choices.iter().map(|c| serde_json::to_string(c).expect("strings serialize")).collect();
            TopLevelGrammar::from_lark(format!("start: {}", quoted.join(" | ")))
        }
    })
}

struct LlgGrammar(Matcher);

impl LlgGrammar {
    fn failed(&self, e: impl std::fmt::Display) -> crate::EngineError {
        invalid(format!("the grammar failed: {}", self.0.get_error().unwrap_or_else(|| e.to_string())))
    }
}

impl Grammar for LlgGrammar {
    fn fill_mask(&mut self, mask: &mut [u32]) -> Result<()> {
        let allowed = self.0.compute_mask_or_eos().map_err(|e| self.failed(e))?;
        let words = allowed.as_slice();
        let n = words.len().min(mask.len());
        mask[..n].copy_from_slice(&words[..n]);
        mask[n..].fill(0);
        Ok(())
    }

    fn allowed_prefix(&mut self, tokens: &[u32]) -> Result<usize> {
        self.0.validate_tokens(tokens).map_err(|e| self.failed(e))
    }

    fn commit(&mut self, token: u32) -> Result<()> {
        self.0.consume_token(token).map_err(|e| self.failed(e))
    }

    fn rollback(&mut self, tokens: usize) -> Result<()> {
        self.0.rollback(tokens).map_err(|e| self.failed(e))
    }

    fn forced_tokens(&mut self) -> Vec<u32> {
        self.0.compute_ff_tokens()
    }

    fn is_finished(&self) -> bool {
        self.0.is_stopped()
    }

    fn fork(&self) -> Box<dyn Grammar> {
        Box::new(LlgGrammar(self.0.deep_clone()))
    }
}

/// The model's tokenizer, for tokenizing forced text as the model would have.
struct ModelTokenizer {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl ModelTokenizer {
    fn encode(tokenizer: &tokenizers::Tokenizer, text: &str) -> Vec<TokenId> {
        tokenizer.encode_fast(text, false).map(|e| e.get_ids().to_vec()).unwrap_or_default()
    }
}

impl TokenizerEnv for ModelTokenizer {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| Self::encode(self.tokenizer.hf(), text))
    }
}

/// Whether the tokenizer spells pieces of text on their own: tokenizers that add a prefix
/// space or a BOS token to every piece (SentencePiece style) cannot tokenize forced text.
fn tokenizes_canonically(trie: &TokTrie, tokenizer: &tokenizers::Tokenizer) -> bool {
    ["{\"name\": ", "abc", " x", "1.5e3}"].iter().all(|text| {
        let ids = ModelTokenizer::encode(tokenizer, text);
        !ids.is_empty() && ids.iter().all(|&t| (t as usize) < trie.vocab_size()) && trie.decode_raw(&ids) == text.as_bytes()
    })
}
