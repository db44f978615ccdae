//! Between text and token ids: the model's tokenizer, its token byte table, incremental UTF-8
//! decoding and stop strings.

mod detokenizer;
mod gguf_vocabulary;
mod stop;
mod tokenizer;

pub use detokenizer::{Detokenizer, TokenTable};
pub use stop::StopText;
pub use tokenizer::Tokenizer;
