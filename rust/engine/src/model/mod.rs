//! The Llama-family model runner (Llama 2/3, SmolLM, Mistral, Qwen2/2.5, Qwen3).

mod linear;
mod llama;
mod rope;

pub use linear::{Compute, Linear, LinearParts, Weights};
pub use llama::{LlamaModel, Precision, SeqChunk};
pub use rope::Rope;
