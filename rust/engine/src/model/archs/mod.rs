//! How each architecture puts the shared layers together: an [`Assembly`] per family, in a file
//! of its own, which the architecture table (`config::ARCHITECTURES`) names. The decoder
//! (`model::decoder`) runs any assembly; a family is a few lines here, not a branch there.

pub mod deepseek;
pub mod gemma;
pub mod glm4;
pub mod gpt_oss;
pub mod granite;
pub mod llama;
pub mod olmo2;
pub mod qwen3_next;

use crate::config::Activation;
use rsgl_kernels::RopeStyle;
use serde::{Serialize, Serializer};

/// Where a sublayer's (attention's or the MLP's) RMS norms sit, by their checkpoint names:
/// `pre` on its input, `post` on its output before it joins the residual stream.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Norms {
    pub pre: Option<&'static str>,
    pub post: Option<&'static str>,
}

/// RMS norms of q and k after their projections, before rope.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum QkNorm {
    None,
    /// One weight of `head_dim` for every head (Qwen3).
    PerHead,
    /// Statistics over all heads at once, a weight per element (OLMo 2).
    AllHeads,
}

/// One decoder layer's arrangement: `x += attention_post?(attention(attention_pre?(x)))`, then
/// the same with the MLP; Granite's scales, SmolLM3's NoPE layers and Gemma's sliding windows
/// come from the config.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Assembly {
    pub attention: Norms,
    pub mlp: Norms,
    pub qk_norm: QkNorm,
    /// The gated MLP's activation where a config does not name one (and in GGUF files).
    pub activation: Activation,
    /// What the family's RMS norms add to their weight as the checkpoint stores it (Gemma's
    /// scale by `1 + w`).
    pub norm_weight_offset: f32,
    /// The embeddings are multiplied by sqrt(hidden_size) (Gemma).
    pub embedding_times_sqrt_hidden: bool,
    /// How the checkpoint pairs each head's rotated elements: Hugging Face's halves, or GLM's
    /// interleaved pairs.
    #[serde(serialize_with = "rope_style_name")]
    pub rope_style: RopeStyle,
    /// q_proj also gives a gate per q head (each head's q, then its gate): the attention's
    /// output is multiplied by its sigmoid before o_proj (Qwen3-Next).
    pub attention_output_gate: bool,
    pub mlp_layout: MlpLayout,
}

/// How a layer's MLP weights are stored, and how a shared expert joins the routed ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MlpLayout {
    /// A matrix per projection (`mlp.gate_proj`, `up_proj`, `down_proj`; Mixtral's experts' `w1`,
    /// `w3`, `w2`; gpt-oss's stacked experts), and Qwen2-MoE's shared expert scaled by a sigmoid gate.
    Separate,
    /// Granite's: `block_sparse_moe.input_linear` stacks every expert's gate then up rows,
    /// `output_linear` their down matrices, `router.layer` routes; `shared_mlp.input_linear` (gate
    /// then up) and `output_linear` run on every token, ungated, beside the experts or alone.
    GraniteShared,
}

fn rope_style_name<S: Serializer>(style: &RopeStyle, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(match style {
        RopeStyle::Neox => "neox",
        RopeStyle::GptJ => "gptj",
    })
}
