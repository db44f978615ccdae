//! The model's tokenizer, once: it encodes prompts, decodes text, and its token table feeds the
//! engine's incremental detokenizer and the grammar backend's trie.

use super::{gguf_vocabulary, TokenTable};
use crate::error::{EngineError, Result};
use serde_json::Value;
use std::collections::{HashMap, HashSet};

/// A `tokenizer.json` tokenizer and the bytes each of the model's token ids adds to text.
pub struct Tokenizer {
    hf: tokenizers::Tokenizer,
    table: TokenTable,
}

impl Tokenizer {
    /// Reads `tokenizer.json` text. `vocab_size` is the model's, when there is one (ids the
    /// tokenizer lacks, such as padding rows of the embedding, decode to nothing); else the
    /// tokenizer's own.
    pub fn from_json(json: &str, vocab_size: Option<usize>) -> Result<Tokenizer> {
        let hf: tokenizers::Tokenizer = json.parse().map_err(|e| EngineError::ModelLoad(format!("cannot read the tokenizer: {e}")))?;
        Tokenizer::new(hf, vocab_size)
    }

    /// The tokenizer a GGUF file's metadata describes (`WeightStore::gguf_metadata`), or None for
    /// a file without a vocabulary; `vocab_size` as for `from_json`.
    pub fn from_gguf(metadata: &serde_json::Map<String, Value>, vocab_size: Option<usize>) -> Result<Option<Tokenizer>> {
        gguf_vocabulary::tokenizer_from_gguf(metadata)?.map(|hf| Tokenizer::new(hf, vocab_size)).transpose()
    }

    fn new(hf: tokenizers::Tokenizer, vocab_size: Option<usize>) -> Result<Tokenizer> {
        let to_bytes = token_to_bytes_function(&hf)?;
        let mut bytes = vec![Vec::new(); vocab_size.unwrap_or_else(|| hf.get_vocab_size(true))];
        for (spelling, id) in hf.get_vocab(true) {
            if let Some(slot) = bytes.get_mut(id as usize) {
                *slot = to_bytes(&spelling);
            }
        }
        let special = hf.get_added_tokens_decoder().into_iter().filter(|(_, token)| token.special).map(|(id, _)| id);
        let table = TokenTable::new(bytes, special);
        Ok(Tokenizer { hf, table })
    }

    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let encoding = self.hf.encode_fast(text, add_special_tokens).map_err(|e| cannot_encode(&e))?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Encodes texts in parallel (the `tokenizers` thread pool).
    pub fn encode_batch(&self, texts: Vec<String>, add_special_tokens: bool) -> Result<Vec<Vec<u32>>> {
        let encodings = self.hf.encode_batch_fast(texts, add_special_tokens).map_err(|e| cannot_encode(&e))?;
        Ok(encodings.iter().map(|e| e.get_ids().to_vec()).collect())
    }

    /// The text of `ids` as the tokenizer's own decoder writes it (a SentencePiece decoder strips
    /// the space it prepended, unlike the token table's byte-by-byte text).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.hf.decode(ids, skip_special_tokens).map_err(|e| EngineError::InvalidRequest(format!("cannot decode these token ids: {e}")))
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.hf.token_to_id(token)
    }

    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.hf.id_to_token(id)
    }

    /// The tokenizer as `tokenizer.json` text.
    pub fn to_json(&self) -> String {
        self.hf.to_string(false).expect("a tokenizer read from JSON writes JSON")
    }

    pub fn table(&self) -> &TokenTable {
        &self.table
    }

    pub(crate) fn hf(&self) -> &tokenizers::Tokenizer {
        &self.hf
    }
}

fn cannot_encode(error: &tokenizers::Error) -> EngineError {
    EngineError::InvalidRequest(format!("cannot tokenize this text: {error}"))
}

type TokenToBytes = fn(&str) -> Vec<u8>;

fn token_to_bytes_function(hf: &tokenizers::Tokenizer) -> Result<TokenToBytes> {
    let types = decoder_types(hf);
    if types.contains("ByteLevel") {
        return Ok(byte_level_token_bytes);
    }
    if ["Metaspace", "ByteFallback", "Replace"].iter().any(|t| types.contains(*t)) {
        return Ok(sentencepiece_token_bytes);
    }
    let mut named: Vec<&str> = types.iter().map(String::as_str).collect();
    named.sort_unstable();
    Err(EngineError::UnsupportedModel(format!(
        "rsgl cannot detokenize with this tokenizer (decoder: {}); it supports byte-level BPE (GPT-2 style) and SentencePiece-style \
         tokenizers. Use a model with one of those, or load it with skip_tokenizer_init=True and pass token ids.",
        if named.is_empty() { "none".to_string() } else { named.join(", ") }
    )))
}

/// Every decoder `type` in the tokenizer's decoder, nested sequences included.
fn decoder_types(hf: &tokenizers::Tokenizer) -> HashSet<String> {
    fn visit(node: &Value, found: &mut HashSet<String>) {
        if let Some(kind) = node.get("type").and_then(Value::as_str) {
            found.insert(kind.to_string());
        }
        for child in node.get("decoders").and_then(Value::as_array).into_iter().flatten() {
            visit(child, found);
        }
    }
    let mut found = HashSet::new();
    if let Some(decoder) = hf.get_decoder() {
        visit(&serde_json::to_value(decoder).expect("decoders serialize"), &mut found);
    }
    found
}

/// GPT-2's table spelling each byte as a printable character (byte-level BPE vocabularies use it):
/// the printable Latin-1 bytes as themselves, the others as U+0100 on, in order.
pub(super) fn byte_alphabet() -> &'static [char; 256] {
    static TABLE: std::sync::OnceLock<[char; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut shifted = 0u32;
        std::array::from_fn(|b| {
            let b = b as u8;
            if printable(b) {
                char::from(b)
            } else {
                shifted += 1;
                char::from_u32(255 + shifted).expect("below U+0200")
            }
        })
    })
}

/// The byte alphabet reversed: character -> byte.
pub(super) fn byte_of_char() -> &'static HashMap<char, u8> {
    static TABLE: std::sync::OnceLock<HashMap<char, u8>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| byte_alphabet().iter().enumerate().map(|(b, &c)| (c, b as u8)).collect())
}

fn byte_level_token_bytes(token: &str) -> Vec<u8> {
    let table = byte_of_char();
    token.chars().map(|c| table.get(&c).copied()).collect::<Option<Vec<u8>>>().unwrap_or_else(|| {
        // As the ByteLevel decoder does: a token outside the byte alphabet (an added token such
        // as "<|im_end|>" spelled with other characters) stands for its own UTF-8 text.
        token.as_bytes().to_vec()
    })
}

fn sentencepiece_token_bytes(token: &str) -> Vec<u8> {
    let byte = token.strip_prefix("<0x").and_then(|rest| rest.strip_suffix('>')).filter(|hex| hex.len() == 2);
    if let Some(value) = byte.and_then(|hex| u8::from_str_radix(hex, 16).ok()) {
        return vec![value];
    }
    token.replace('\u{2581}', " ").into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A SentencePiece-style BPE tokenizer.json with `decoder` as its decoder.
    fn sentencepiece_json(decoder: Value) -> String {
        let vocab = json!({"<unk>": 0, "<s>": 1, "</s>": 2, "<0x0A>": 3, "\u{2581}": 4, "a": 5, "\u{2581}a": 6});
        let special = |id: u32, content: &str| json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
        json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [special(0, "<unk>"), special(1, "<s>"), special(2, "</s>")],
            "normalizer": null,
            "pre_tokenizer": {"type": "Metaspace", "replacement": "\u{2581}", "prepend_scheme": "first", "split": false},
            "post_processor": null,
            "decoder": decoder,
            "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "continuing_subword_prefix": null, "end_of_word_suffix": null,
                      "fuse_unk": true, "byte_fallback": true, "ignore_merges": false, "vocab": vocab, "merges": [["\u{2581}", "a"]]}
        })
        .to_string()
    }

    #[test]
    fn sentencepiece_tokenizers_spell_their_table_and_encode_decode() {
        let decoder = json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
        let tokenizer = Tokenizer::from_json(&sentencepiece_json(decoder), Some(9)).unwrap();
        let table = tokenizer.table();
        assert_eq!(table.len(), 9, "the model's vocabulary, past the tokenizer's");
        assert_eq!((table.bytes(6, false), table.bytes(3, false), table.bytes(8, false)), (&b" a"[..], &b"\n"[..], &b""[..]));
        assert!(table.is_special(2) && !table.is_special(5));
        assert_eq!(tokenizer.encode("a a", false).unwrap(), [6, 6]);
        assert_eq!(tokenizer.encode_batch(vec!["a".into(), "aa".into()], false).unwrap(), [vec![6], vec![6, 5]]);
        assert_eq!(tokenizer.decode(&[6, 6, 2], true).unwrap(), "a a", "the prepended space stripped, </s> skipped");
        let reread = Tokenizer::from_json(&tokenizer.to_json(), None).unwrap();
        assert_eq!(reread.table().len(), 7, "the tokenizer's own vocabulary");
    }

    #[test]
    fn a_decoder_without_byte_spelling_is_refused_by_name() {
        let Err(EngineError::UnsupportedModel(message)) =
            Tokenizer::from_json(&sentencepiece_json(json!({"type": "WordPiece", "prefix": "##", "cleanup": true})), None)
        else {
            panic!("a WordPiece decoder must be refused");
        };
        assert!(message.contains("WordPiece"), "{message}");
        assert!(matches!(Tokenizer::from_json("{}", None), Err(EngineError::ModelLoad(_))));
    }

    #[test]
    fn gpt2_byte_alphabet_covers_every_byte_once() {
        let table = byte_of_char();
        assert_eq!(table.len(), 256);
        assert_eq!(table[&'\u{120}'], b' ');
        assert_eq!(table[&'\u{10a}'], b'\n');
        assert_eq!(table[&'a'], b'a');
        assert_eq!(byte_level_token_bytes("\u{120}hi"), b" hi");
        assert_eq!(byte_level_token_bytes("\u{2581}x"), "\u{2581}x".as_bytes(), "outside the alphabet: its own text");
    }

    #[test]
    fn sentencepiece_pieces_spell_spaces_and_bytes() {
        assert_eq!(sentencepiece_token_bytes("\u{2581}the"), b" the");
        assert_eq!(sentencepiece_token_bytes("<0x0A>"), b"\n");
        assert_eq!(sentencepiece_token_bytes("<0xZZ>"), b"<0xZZ>");
    }
}
