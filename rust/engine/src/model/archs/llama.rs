//! Llama and the families built like it (Mistral, Qwen2, Qwen3, their mixtures of experts,
//! SmolLM3 with its NoPE layers and Granite with its scales, both from their configs): an RMS
//! norm before each sublayer, none after.

use super::{Assembly, MlpLayout, Norms, QkNorm};
use crate::config::Activation;
use rsgl_kernels::RopeStyle;

const PRE_NORMS: (Norms, Norms) = (Norms { pre: Some("input_layernorm"), post: None }, Norms { pre: Some("post_attention_layernorm"), post: None });

pub const LLAMA: Assembly = Assembly {
    attention: PRE_NORMS.0,
    mlp: PRE_NORMS.1,
    qk_norm: QkNorm::None,
    activation: Activation::Silu,
    norm_weight_offset: 0.0,
    embedding_times_sqrt_hidden: false,
    rope_style: RopeStyle::Neox,
    attention_output_gate: false,
    mlp_layout: MlpLayout::Separate,
};

/// Qwen3 normalizes each head of q and k.
pub const QWEN3: Assembly = Assembly { qk_norm: QkNorm::PerHead, ..LLAMA };
