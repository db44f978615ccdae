//! OLMo 2: no norm before a sublayer, one on its output (`post_attention_layernorm`,
//! `post_feedforward_layernorm`), and q and k normalized over all heads at once.

use super::{llama::LLAMA, Assembly, Norms, QkNorm};

pub const OLMO2: Assembly = Assembly {
    attention: Norms { pre: None, post: Some("post_attention_layernorm") },
    mlp: Norms { pre: None, post: Some("post_feedforward_layernorm") },
    qk_norm: QkNorm::AllHeads,
    ..LLAMA
};
