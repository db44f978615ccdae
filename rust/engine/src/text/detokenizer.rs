use std::collections::HashSet;

/// The bytes each token contributes to text (prepared by the loader from the tokenizer), and
/// which tokens are special (left out of text when `skip_special_tokens`).
#[derive(Clone)]
pub struct TokenTable {
    bytes: Vec<Vec<u8>>,
    special: HashSet<u32>,
}

impl TokenTable {
    pub fn new(bytes: Vec<Vec<u8>>, special: impl IntoIterator<Item = u32>) -> Self {
        TokenTable { bytes, special: special.into_iter().collect() }
    }

    pub fn bytes(&self, token: u32, skip_special: bool) -> &[u8] {
        if skip_special && self.special.contains(&token) {
            return &[];
        }
        self.bytes.get(token as usize).map(Vec::as_slice).unwrap_or(&[])
    }

    /// Tokens in the table (the model's vocabulary).
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    pub fn is_special(&self, token: u32) -> bool {
        self.special.contains(&token)
    }
}

/// Turns a stream of token bytes into text without ever splitting a UTF-8 sequence: bytes of an
/// incomplete character wait for the next token.
#[derive(Default)]
pub struct Detokenizer {
    pending: Vec<u8>,
}

impl Detokenizer {
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut text = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    text.push_str(s);
                    self.pending.clear();
                    return text;
                }
                Err(e) => {
                    let valid = e.valid_up_to();
                    text.push_str(std::str::from_utf8(&self.pending[..valid]).expect("checked prefix"));
                    match e.error_len() {
                        // Truncated at the end: keep the tail for the next token.
                        None => {
                            self.pending.drain(..valid);
                            return text;
                        }
                        // Bytes that can never become valid: emit U+FFFD as decoders do.
                        Some(bad) => {
                            text.push(char::REPLACEMENT_CHARACTER);
                            self.pending.drain(..valid + bad);
                        }
                    }
                }
            }
        }
    }

    /// Whatever is left at the end of the sequence, with broken bytes replaced.
    pub fn flush(&mut self) -> String {
        let rest = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        rest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn multibyte_characters_split_over_tokens_come_out_whole() {
        let text = "héllo 🌍!";
        let mut d = Detokenizer::default();
        let mut out = String::new();
        for b in text.as_bytes() {
            let piece = d.push(&[*b]);
            assert!(std::str::from_utf8(piece.as_bytes()).is_ok());
            out.push_str(&piece);
        }
        out.push_str(&d.flush());
        assert_eq!(out, text);
    }

    #[test]
    fn invalid_bytes_become_replacement_characters() {
        let mut d = Detokenizer::default();
        assert_eq!(d.push(&[b'a', 0xff, b'b']), "a\u{fffd}b");
        assert_eq!(d.push(&[0xf0, 0x9f]), "");
        assert_eq!(d.flush(), "\u{fffd}");
    }

    #[test]
    fn special_tokens_can_be_skipped() {
        let table = TokenTable::new(vec![b"a".to_vec(), b"<eos>".to_vec()], [1]);
        assert_eq!(table.bytes(1, true), b"");
        assert_eq!(table.bytes(1, false), b"<eos>");
        assert_eq!(table.bytes(7, false), b"", "ids past the table decode to nothing");
    }
}
