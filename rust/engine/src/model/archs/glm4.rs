//! GLM-4: a norm before and after each sublayer (the "sandwich"), rope over the first part of each
//! head with its pairs interleaved (GPT-J's layout), q/k/v biases from the config and a fused
//! `gate_up_proj` (the loader splits it).
//!
//! GLM-4.5 (`glm4_moe`) is built as Llama is, with rope over the first part of each head in
//! halves, q and k normalized per head where the config says `use_qk_norm`, and DeepSeek-V3's
//! routing (sigmoid scores, expert groups) after its first dense layers.

use super::{llama::LLAMA, Assembly, Norms, QkNorm};
use rsgl_kernels::RopeStyle;

pub const GLM4: Assembly = Assembly {
    attention: Norms { pre: Some("input_layernorm"), post: Some("post_self_attn_layernorm") },
    mlp: Norms { pre: Some("post_attention_layernorm"), post: Some("post_mlp_layernorm") },
    rope_style: RopeStyle::GptJ,
    ..LLAMA
};

pub const GLM4_MOE: Assembly = Assembly { qk_norm: QkNorm::PerHead, ..LLAMA };
