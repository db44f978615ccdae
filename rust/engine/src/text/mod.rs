//! From token ids to text: the token byte table, incremental UTF-8 decoding and stop strings.

mod detokenizer;
mod stop;

pub use detokenizer::{Detokenizer, TokenTable};
pub use stop::StopText;
