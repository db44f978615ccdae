//! rsgl-engine: everything between the Python front and the kernels.
//!
//! The engine runs on its own thread ([`engine`]): requests arrive on a channel, the scheduler
//! ([`scheduler`]) shares cached prefixes from the radix tree ([`kv`]) and packs prefill chunks
//! and decodes into one ragged batch per step, the model
//! ([`model`]) runs it over a paged KV pool ([`kv`]), the sampler ([`sample`]) picks tokens and
//! the detokenizer ([`text`]) turns them into text with stop strings applied. Constrained
//! requests ([`grammar`]) sample from a token mask and skip over text their grammar forces.
//! With speculation on ([`speculative`]), a decoding request's step also verifies tokens drafted from
//! text it has seen.
//! An embedding engine's requests pool the model's hidden states instead ([`pooling`]).

mod batch;
pub mod config;
pub mod engine;
pub mod error;
pub mod grammar;
pub mod kv;
pub mod model;
pub mod policy;
pub mod pooling;
pub mod request;
mod reserve;
pub mod sample;
mod scheduler;
mod sequence;
pub mod speculative;
pub mod text;
pub mod weights;

pub use config::{EngineOptions, ModelConfig};
pub use engine::{Engine, RequestStream};
pub use error::{EngineError, Result};
pub use request::{EmbedRequest, GenerateRequest, Output, Waker};
/// Where engine steps' time goes, by phase (off unless turned on; `rsgl-bench generate --profile`).
pub use rsgl_kernels::profile;
pub use text::Tokenizer;
pub use weights::WeightStore;

/// Name of the kernel path chosen for this CPU ("avx2", "neon", "portable").
pub fn kernel_isa() -> &'static str {
    rsgl_kernels::kernels().isa
}
