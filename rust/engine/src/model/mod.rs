//! The decoder runner: shared layers (embedding, linear, MLP, rope), the decoder that runs a
//! forward pass over them, and each architecture's assembly of them (`archs`).

pub mod archs;
mod attention;
mod decoder;
mod delta_net;
mod embedding;
mod latent_attention;
mod linear;
mod lora;
mod mamba2;
mod mlp;
mod mrope;
mod qwen2_vl_vision;
mod recurrent;
mod rope;
mod tensor_parallel;
mod vision;
mod vision_attention;

pub use decoder::{DecoderModel, LoraPacker, ModelOutput, Precision, SeqChunk};
pub use linear::{Compute, Linear, LinearParts, Weights};
pub use lora::{LoraAdapter, LoraTarget, PeftAdapter, PeftConfig, TargetModules};
pub use mrope::{ImageRun, MropePositions};
pub use rope::Rope;
pub use tensor_parallel::{AllReduce, Shard};
