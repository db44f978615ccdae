//! GLM-4: a norm before and after each sublayer (the "sandwich"), rope over the first part of each
//! head with its pairs interleaved (GPT-J's layout), q/k/v biases from the config and a fused
//! `gate_up_proj` (the loader splits it).

use super::{llama::LLAMA, Assembly, Norms};
use rsgl_kernels::RopeStyle;

pub const GLM4: Assembly = Assembly {
    attention: Norms { pre: Some("input_layernorm"), post: Some("post_self_attn_layernorm") },
    mlp: Norms { pre: Some("post_attention_layernorm"), post: Some("post_mlp_layernorm") },
    rope_style: RopeStyle::GptJ,
    ..LLAMA
};
