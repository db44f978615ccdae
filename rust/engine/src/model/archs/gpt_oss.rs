//! gpt-oss: Llama's pre-norms with q/k/v/o biases (from the table), a learned sink logit per
//! head in every attention softmax (`self_attn.sinks`, read where the checkpoint has it),
//! alternating sliding and full layers (the config's `layer_types`), and experts with biases,
//! a router with a bias, and the clamped SwiGLU, stored stacked (the MLP loader splits them).

use super::{llama::LLAMA, Assembly};
use crate::config::Activation;

pub const GPT_OSS: Assembly = Assembly { activation: Activation::ClampedSwiglu, ..LLAMA };
