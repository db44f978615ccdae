//! The Llama-family model runner (Llama 2/3, SmolLM, Mistral, Qwen2/2.5, Qwen3) and its
//! mixture-of-experts variants (Mixtral, Qwen2-MoE, Qwen3-MoE).

mod embedding;
mod linear;
mod llama;
mod mlp;
mod rope;
mod tensor_parallel;

pub use linear::{Compute, Linear, LinearParts, Weights};
pub use llama::{LlamaModel, ModelOutput, Precision, SeqChunk};
pub use rope::Rope;
pub use tensor_parallel::{AllReduce, Shard};
