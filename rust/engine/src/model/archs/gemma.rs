//! Gemma 2 and Gemma 3: an RMS norm before and after each sublayer, GeGLU MLPs, embeddings
//! scaled by sqrt(hidden_size), norms that scale by `1 + w`; Gemma 3 normalizes each head of q
//! and k. Which layers slide, their rope base, the attention scale and Gemma 2's soft caps come
//! from the config.

use super::{Assembly, MlpLayout, Norms, QkNorm};
use crate::config::Activation;
use rsgl_kernels::RopeStyle;

pub const GEMMA2: Assembly = Assembly {
    attention: Norms { pre: Some("input_layernorm"), post: Some("post_attention_layernorm") },
    mlp: Norms { pre: Some("pre_feedforward_layernorm"), post: Some("post_feedforward_layernorm") },
    qk_norm: QkNorm::None,
    activation: Activation::GeluTanh,
    norm_weight_offset: 1.0,
    embedding_times_sqrt_hidden: true,
    rope_style: RopeStyle::Neox,
    attention_output_gate: false,
    mlp_layout: MlpLayout::Separate,
};

pub const GEMMA3: Assembly = Assembly { qk_norm: QkNorm::PerHead, ..GEMMA2 };
