//! The normalized model config, mapped from a checkpoint's own over the table of architectures
//! (transformers' config.json by `ModelConfig::from_hf_config`, a GGUF file's metadata by
//! `ModelConfig::from_gguf`), and the engine's options.

mod architecture;
mod gguf;
mod hf;
mod keys;
mod qwen_vision;
mod vision;

pub use architecture::{Architecture, MoeFacts, RecurrentMixer, ARCHITECTURES};

use crate::error::{EngineError, Result};
use crate::kv::window::window_pages_per_request;
use crate::kv::Pools;
use crate::policy::SchedulePolicy;
use crate::pooling::Pooling;
use crate::request::deserialize_with_path;
use crate::speculative::SpeculativeAlgorithm;
use rsgl_kernels::{ActivationBits, WeightDtype};
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;

/// The model as the runner sees it; its serde form is the normalized config the Python loader
/// holds and hands back to the engine.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub architecture: String,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    #[serde(serialize_with = "as_written")]
    pub rms_norm_eps: f32,
    pub rope_theta: f64,
    pub rope_scaling: Option<RopeScaling>,
    /// How many of each head's first dimensions rope rotates, where not all (Phi-4-mini's
    /// `partial_rotary_factor`).
    #[serde(default)]
    pub rotary_dim: Option<usize>,
    pub attention_bias: bool,
    pub qk_norm: bool,
    pub tie_word_embeddings: bool,
    pub max_position_embeddings: usize,
    /// Mixture-of-experts MLPs in every layer (Mixtral, Qwen2-MoE, Qwen3-MoE); dense when absent.
    #[serde(default)]
    pub moe: Option<MoeConfig>,
    /// How the model pools an embedding, when its files say (sentence-transformers' pooling
    /// config, a GGUF file's `pooling_type`); embedding engines pool the last token otherwise.
    #[serde(default)]
    pub pooling: Option<Pooling>,
    /// Scales some models put on the embeddings, the sublayers' outputs, the attention scores
    /// and the logits (Granite's multipliers); none elsewhere.
    #[serde(default)]
    pub scales: Scales,
    /// Layers that leave q and k unrotated (SmolLM3's NoPE layers).
    #[serde(default)]
    pub no_rope_layers: Vec<usize>,
    /// Layers that attend only to recent positions (Gemma's local layers); the rest see all.
    #[serde(default)]
    pub sliding_window: Option<SlidingWindow>,
    /// The gated MLP's activation.
    #[serde(default)]
    pub activation: Activation,
    /// Added to every RMS norm weight as stored: Gemma's norms scale by `1 + w` and its Hugging
    /// Face checkpoints store `w` (llama.cpp's converter stores `1 + w`).
    #[serde(default, serialize_with = "as_written")]
    pub norm_weight_offset: f32,
    /// Layers whose token mixer is a Gated DeltaNet in place of attention (Qwen3-Next, Qwen3.5):
    /// a fixed-size state per sequence instead of KV pages.
    #[serde(default)]
    pub gated_delta_net: Option<GatedDeltaNet>,
    /// Layers whose token mixer is a Mamba-2 selective state space layer in place of attention
    /// (Granite 4's hybrids): a fixed-size state per sequence instead of KV pages.
    #[serde(default)]
    pub mamba2: Option<Mamba2>,
    /// Multi-head latent attention in every layer (DeepSeek-V2/V3). Its KV pages hold one kv head
    /// per token (`num_key_value_heads` 1) whose key is the latent and the rope key,
    /// `head_dim = kv_lora_rank + qk_rope_head_dim` wide, and whose value is the key's latent part.
    #[serde(default)]
    pub latent_attention: Option<LatentAttention>,
    /// A vision-language model's image encoder; None for text-only models.
    #[serde(default)]
    pub vision: Option<ImageEncoder>,
}

/// A vision-language model's image encoder, by the family of its vision tower.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(tag = "tower")]
pub enum ImageEncoder {
    /// SmolVLM's and Idefics3's.
    #[serde(rename = "siglip")]
    Siglip(VisionConfig),
    #[serde(rename = "qwen2_5_vl")]
    Qwen2_5Vl(Qwen2_5VlVision),
}

/// Qwen2.5-VL's vision tower: an image of any size (sides multiples of `patch_size *
/// spatial_merge_size`) cut into `patch_size` squares, each over `temporal_patch_size` frames
/// (a still image repeated), embedded by a 3D convolution without bias; `depth` pre-norm ViT
/// blocks (RMSNorm, attention with a 2D rope over the patch's row and column, a SwiGLU MLP with
/// biases), attending within windows of `window_size` pixels except the `fullatt_block_indexes`
/// blocks, which see the whole image; a merger (RMSNorm, then a GELU MLP) folds each
/// `spatial_merge_size` squared patches into one token of `out_hidden_size`, in place of the
/// prompt's `image_token_id` tokens. Those tokens take 3D positions in the language model
/// (M-RoPE): its rotary frequencies split in `mrope_section` parts, turned by the token's
/// frame, row and column.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Qwen2_5VlVision {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub depth: usize,
    pub num_heads: usize,
    pub patch_size: usize,
    pub temporal_patch_size: usize,
    pub spatial_merge_size: usize,
    pub window_size: usize,
    pub fullatt_block_indexes: Vec<usize>,
    pub out_hidden_size: usize,
    pub rope_theta: f64,
    pub image_token_id: u32,
    pub mrope_section: [usize; 3],
}

/// A SigLIP-style vision tower (SmolVLM, Idefics3, Gemma 3): square tiles of `image_size` pixels
/// cut into `patch_size` patches, `num_hidden_layers` pre-norm ViT blocks (LayerNorm, attention
/// and a GELU-tanh MLP, all with biases); its projector folds each `scale_factor` x
/// `scale_factor` square of neighbouring patches into one token of the language model's width,
/// in place of the prompt's `image_token_id` tokens.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct VisionConfig {
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub image_size: usize,
    pub patch_size: usize,
    #[serde(serialize_with = "as_written")]
    pub layer_norm_eps: f32,
    pub scale_factor: usize,
    pub projector: VisionProjector,
    pub image_token_id: u32,
    /// The language model attends both ways within each run of image tokens (Gemma 3): every
    /// query of a run sees the whole run, as well as what precedes it.
    pub bidirectional_image_tokens: bool,
    /// Added to the projector's RMS norm weight as stored (Gemma 3's, which scales by `1 + w`:
    /// its Hugging Face checkpoints store `w`, llama.cpp's projector files `1 + w`).
    #[serde(default, serialize_with = "as_written")]
    pub projector_norm_offset: f32,
}

/// How a vision tower's patches become the language model's image tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum VisionProjector {
    /// SmolVLM's and Idefics3's: each square's patches side by side (a pixel shuffle), then one
    /// linear layer.
    PixelShuffle,
    /// Gemma 3's: each square's patches averaged, an RMS norm (its weight plus
    /// `projector_norm_offset`), then a matrix stored `[vision hidden, text hidden]`.
    AveragePool,
}

/// The shape of multi-head latent attention: q from the hidden state (through a rank
/// `q_lora_rank` bottleneck where set), each token's keys and values from one latent of
/// `kv_lora_rank` (the KV pages keep it) up-projected per head, beside a rope key of
/// `qk_rope_head_dim` shared by every head.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LatentAttention {
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
}

impl LatentAttention {
    /// The width of each head's q and (expanded) k: its part without rope, then its rope part.
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }

    /// The width of a KV page row: the latent, then the rope key.
    pub fn latent_key_dim(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }

    /// DeepSeek's attention scale: 1/sqrt(q's head width) times YaRN's `mscale` squared (1
    /// without YaRN).
    pub fn attention_scale(&self, mscale: f64) -> f32 {
        let base = 1.0 / (self.qk_head_dim() as f64).sqrt();
        (base * mscale * mscale) as f32
    }
}

/// The shape of Gated DeltaNet layers: a short causal convolution over q, k and v, then the gated
/// delta rule (`rsgl_kernels::delta_rule`) per value head, each group of value heads sharing a
/// key head.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct GatedDeltaNet {
    pub layers: Vec<usize>,
    pub key_heads: usize,
    pub value_heads: usize,
    pub key_head_dim: usize,
    pub value_head_dim: usize,
    /// Taps of the causal convolution (the state keeps the last `conv_kernel - 1` inputs).
    pub conv_kernel: usize,
    /// The order of the value heads in the layer's tensors.
    #[serde(default)]
    pub value_head_order: ValueHeadOrder,
}

/// How a Gated DeltaNet checkpoint orders its value heads, which share key heads `value_heads /
/// key_heads` each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ValueHeadOrder {
    /// Each key head's value heads side by side (Hugging Face checkpoints).
    #[default]
    Grouped,
    /// One value head of each key head in turn, key heads cycling fastest: how llama.cpp's
    /// converter stores Qwen3.5 (for ggml's broadcasting). Every per-value-head tensor is so
    /// ordered, out_proj's columns too, which a quantized file cannot have put back in place.
    Tiled,
}

impl GatedDeltaNet {
    /// The key head that value head `head` (in the checkpoint's order) reads.
    pub fn key_head_of(&self, head: usize) -> usize {
        match self.value_head_order {
            ValueHeadOrder::Grouped => head / (self.value_heads / self.key_heads),
            ValueHeadOrder::Tiled => head % self.key_heads,
        }
    }

    /// Channels of the convolution: q, k and v side by side.
    pub fn conv_channels(&self) -> usize {
        2 * self.key_heads * self.key_head_dim + self.value_heads * self.value_head_dim
    }

    /// Values of one layer's state of one sequence: the convolution's window, then the delta
    /// rule's `[key_head_dim][value_head_dim]` matrix per value head.
    pub fn state_len(&self) -> usize {
        self.conv_channels() * (self.conv_kernel - 1) + self.value_heads * self.key_head_dim * self.value_head_dim
    }
}

/// The shape of Mamba-2 layers: a short causal convolution over x, B and C, then the selective
/// state space recurrence (`rsgl_kernels::ssd`) per head, each group of heads sharing B and C.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Mamba2 {
    pub layers: Vec<usize>,
    pub heads: usize,
    pub head_dim: usize,
    /// Elements of B and C (and of each head's state per head dimension).
    pub state_size: usize,
    /// Groups of heads sharing one B and one C; the gated RMS norm normalizes each group's
    /// heads together.
    pub groups: usize,
    /// Taps of the causal convolution (the state keeps the last `conv_kernel - 1` inputs).
    pub conv_kernel: usize,
}

impl Mamba2 {
    /// Width of x (and of the gate z): every head's.
    pub fn inner_size(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Channels of the convolution: x, B and C side by side.
    pub fn conv_channels(&self) -> usize {
        self.inner_size() + 2 * self.groups * self.state_size
    }

    /// Values of one layer's state of one sequence: the convolution's window, then the
    /// `[state_size][head_dim]` state per head.
    pub fn state_len(&self) -> usize {
        self.conv_channels() * (self.conv_kernel - 1) + self.heads * self.state_size * self.head_dim
    }
}

/// Sliding-window attention in some layers: the query at position `p` sees positions
/// `p + 1 - size ..= p` only.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SlidingWindow {
    pub size: usize,
    /// The layers that slide.
    pub layers: Vec<usize>,
    /// Their rope base where it is not the global layers' (Gemma 3's local layers rotate with
    /// base 10,000 and no scaling, its global ones with 1,000,000 and the config's scaling).
    pub rope_theta: Option<f64>,
}

impl SlidingWindow {
    /// The layers of `layers` that slide when each `every`th attends globally (Gemma's pattern).
    pub(crate) fn all_but_every(every: usize, layers: usize) -> Vec<usize> {
        (0..layers).filter(|layer| (layer + 1) % every != 0).collect()
    }
}

/// The activation of the gated MLP, `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Activation {
    /// SwiGLU (Llama and most families).
    #[default]
    Silu,
    /// GeGLU with GELU's tanh approximation (Gemma: `gelu_pytorch_tanh`).
    GeluTanh,
    /// gpt-oss's SwiGLU, its inputs clamped to 7 and `up` shifted by one
    /// (`rsgl_kernels::portable::clamped_swiglu_mul`).
    ClampedSwiglu,
}

/// Granite's `embedding_multiplier`, `residual_multiplier` (on each sublayer's output before it
/// joins the residual stream), `attention_multiplier` (the attention score scale, in place of
/// 1/sqrt(head_dim)) and `logits_scaling` (the logits' divisor); Gemma's embedding scale
/// (sqrt(hidden_size)), attention scale (`query_pre_attn_scalar`) and Gemma 2's soft caps
/// (`cap * tanh(x / cap)` on the attention scores and on the logits); Ministral 3's query scale
/// by position.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Scales {
    #[serde(serialize_with = "as_written")]
    pub embedding: f32,
    #[serde(serialize_with = "as_written")]
    pub residual: f32,
    #[serde(serialize_with = "option_as_written")]
    pub attention: Option<f32>,
    #[serde(serialize_with = "as_written")]
    pub logits_divisor: f32,
    #[serde(default, serialize_with = "option_as_written")]
    pub attention_logit_cap: Option<f32>,
    #[serde(default, serialize_with = "option_as_written")]
    pub final_logit_cap: Option<f32>,
    /// Ministral 3's position-dependent query scale (Llama 4's attention temperature).
    #[serde(default)]
    pub query_temperature: Option<QueryTemperature>,
}

/// q at position `p` multiplied by `1 + beta * ln(1 + floor(p / length))`: attention sharpens
/// past each multiple of `length` (the original context) as the scores spread over more keys.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct QueryTemperature {
    #[serde(serialize_with = "as_written")]
    pub beta: f32,
    pub length: usize,
}

impl QueryTemperature {
    pub fn at(&self, position: usize) -> f32 {
        1.0 + self.beta * ((1 + position / self.length) as f32).ln()
    }
}

impl Default for Scales {
    fn default() -> Self {
        Scales {
            embedding: 1.0,
            residual: 1.0,
            attention: None,
            logits_divisor: 1.0,
            attention_logit_cap: None,
            final_logit_cap: None,
            query_temperature: None,
        }
    }
}

/// A sparse MLP: a router scores every expert (`scoring`), picks `experts_per_token` of
/// `num_experts` SwiGLU experts per token (from the best `expert_groups` only, where set, and by
/// the scores plus the router's bias where it has one), and weighs each by its score,
/// renormalized over the chosen when `norm_topk_prob`, times `routed_scaling_factor`. Qwen2-MoE
/// adds a shared expert scaled by a sigmoid gate, DeepSeek an unscaled one; DeepSeek's first
/// `dense_layers` layers have a dense MLP instead.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub experts_per_token: usize,
    pub expert_intermediate_size: usize,
    pub norm_topk_prob: bool,
    pub shared_expert_intermediate_size: Option<usize>,
    #[serde(default)]
    pub scoring: ExpertScoring,
    #[serde(default)]
    pub expert_groups: Option<ExpertGroups>,
    #[serde(default = "one", serialize_with = "as_written")]
    pub routed_scaling_factor: f32,
    #[serde(default)]
    pub dense_layers: usize,
}

fn one() -> f32 {
    1.0
}

/// How a router's logits become expert scores.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExpertScoring {
    /// A softmax over every expert.
    #[default]
    Softmax,
    /// Each expert's own sigmoid (DeepSeek-V3, GLM-4.5).
    Sigmoid,
}

/// Group-limited routing (DeepSeek): the experts form `groups` equal groups, and a token's experts
/// come from its `groups_per_token` best groups only, each group ranked by `score`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ExpertGroups {
    pub groups: usize,
    pub groups_per_token: usize,
    pub score: GroupScore,
}

/// What ranks a group of experts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupScore {
    /// Its best expert's score (DeepSeek-V2).
    Best,
    /// The sum of its best two (DeepSeek-V3, GLM-4.5).
    BestTwo,
}

/// Rope frequency scaling schemes the runner implements.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(tag = "rope_type", rename_all = "lowercase", deny_unknown_fields)]
pub enum RopeScaling {
    /// Positions divided by `factor` (Gemma 3's global layers).
    Linear {
        factor: f64,
    },
    /// Phi-3's LongRoPE: each frequency divided by its own factor, `short_factor` below
    /// `original_max_position_embeddings` and `long_factor` from there on, and cos and sin
    /// multiplied by `attention_factor`.
    LongRope {
        short_factor: Vec<f64>,
        long_factor: Vec<f64>,
        original_max_position_embeddings: usize,
        attention_factor: f64,
    },
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: f64,
    },
    /// YaRN: the frequencies that turn more than `beta_fast` times over the original context
    /// kept, those that turn fewer than `beta_slow` times divided by `factor`, a linear blend
    /// in between (over frequency indices), and cos and sin multiplied by `attention_factor`.
    Yarn {
        factor: f64,
        original_max_position_embeddings: usize,
        beta_fast: f64,
        beta_slow: f64,
        /// The blend's bounds rounded out to whole indices (transformers' default, and ggml's
        /// only way); gpt-oss blends between the exact bounds.
        truncate: bool,
        attention_factor: f64,
    },
}

impl RopeScaling {
    /// YaRN's attention factor where a config gives none, as transformers derives it from the
    /// context's growth `factor`: 1 + 0.1 ln(factor), or with DeepSeek's `mscale` and
    /// `mscale_all_dim` (both set) the ratio of that with each as the 0.1's multiplier.
    pub(crate) fn yarn_attention_factor(factor: f64, mscale: Option<f64>, mscale_all_dim: Option<f64>) -> f64 {
        match (mscale.filter(|m| *m != 0.0), mscale_all_dim.filter(|m| *m != 0.0)) {
            (Some(mscale), Some(all_dim)) => Self::yarn_mscale(factor, mscale) / Self::yarn_mscale(factor, all_dim),
            _ => Self::yarn_mscale(factor, 1.0),
        }
    }

    /// transformers' `yarn_get_mscale`: 1 + 0.1 `multiplier` ln(factor), 1 for a factor of 1 or less.
    pub(crate) fn yarn_mscale(factor: f64, multiplier: f64) -> f64 {
        if factor <= 1.0 {
            1.0
        } else {
            0.1 * multiplier * factor.ln() + 1.0
        }
    }
}

impl ModelConfig {
    pub fn from_json(json: &str) -> Result<Self> {
        Self::deserialize_from(&mut serde_json::Deserializer::from_str(json))
    }

    /// From any serde source: JSON text, or the Python objects the binding passes.
    pub fn deserialize_from<'de, D: Deserializer<'de>>(de: D) -> Result<Self> {
        let cfg: ModelConfig = deserialize_with_path(de).map_err(|e| EngineError::ModelLoad(format!("model config is not usable: {e}")))?;
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<()> {
        if Architecture::named(&self.architecture).is_none() {
            let supported = Architecture::list(|a| Some(a.name));
            return Err(EngineError::UnsupportedModel(format!("architecture {:?} is not supported; rsgl runs {supported}", self.architecture)));
        }
        let positive = [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("vocab_size", self.vocab_size),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(EngineError::ModelLoad(format!("model config: {name} must be positive")));
        }
        if !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return Err(EngineError::ModelLoad(format!(
                "model config: num_attention_heads ({}) must be a multiple of num_key_value_heads ({})",
                self.num_attention_heads, self.num_key_value_heads
            )));
        }
        if let Some(moe) = &self.moe {
            if moe.experts_per_token == 0 || moe.experts_per_token > moe.num_experts || moe.expert_intermediate_size == 0 {
                return Err(EngineError::ModelLoad(format!(
                    "model config: {} experts per token of {} (each of size {}) is not a usable mixture of experts",
                    moe.experts_per_token, moe.num_experts, moe.expert_intermediate_size
                )));
            }
            if let Some(groups) = moe.expert_groups {
                let per_group = moe.num_experts.checked_div(groups.groups).unwrap_or(0);
                if per_group == 0
                    || !moe.num_experts.is_multiple_of(groups.groups)
                    || groups.groups_per_token > groups.groups
                    || groups.groups_per_token * per_group < moe.experts_per_token
                {
                    return Err(EngineError::ModelLoad(format!(
                        "model config: {} experts in {} groups, {} groups per token, cannot give {} experts per token",
                        moe.num_experts, groups.groups, groups.groups_per_token, moe.experts_per_token
                    )));
                }
            }
        }
        if let Some(latent) = &self.latent_attention {
            if self.num_key_value_heads != 1 || self.head_dim != latent.latent_key_dim() || self.rotary_dim != Some(latent.qk_rope_head_dim) {
                return Err(EngineError::ModelLoad(format!(
                    "model config: latent attention {latent:?} keeps one kv head of {} with {} rotary dimensions, not {} of {} with {:?}",
                    latent.latent_key_dim(),
                    latent.qk_rope_head_dim,
                    self.num_key_value_heads,
                    self.head_dim,
                    self.rotary_dim
                )));
            }
        }
        if !self.head_dim.is_multiple_of(2) || self.rotary_dim.is_some_and(|dim| dim == 0 || dim > self.head_dim || !dim.is_multiple_of(2)) {
            return Err(EngineError::ModelLoad(format!(
                "model config: rope needs an even head_dim ({}) and an even rotary_dim ({:?}) no larger",
                self.head_dim, self.rotary_dim
            )));
        }
        if let Some(section) = self.vision.as_ref().and_then(ImageEncoder::mrope_section) {
            let frequencies = self.rotary_dim.unwrap_or(self.head_dim) / 2;
            if section.iter().sum::<usize>() != frequencies {
                return Err(EngineError::ModelLoad(format!(
                    "model config: mrope_section {section:?} must split the {frequencies} rotary frequencies of a head"
                )));
            }
        }
        if let Some(RopeScaling::LongRope { short_factor, long_factor, .. }) = &self.rope_scaling {
            let frequencies = self.rotary_dim.unwrap_or(self.head_dim) / 2;
            if short_factor.len() != frequencies || long_factor.len() != frequencies {
                return Err(EngineError::ModelLoad(format!(
                    "model config: LongRoPE needs {frequencies} short and long factors (one per rotary frequency); it has {} and {}",
                    short_factor.len(),
                    long_factor.len()
                )));
            }
        }
        if let Some(RopeScaling::Yarn { factor, original_max_position_embeddings, .. }) = &self.rope_scaling {
            if *factor <= 0.0 || *original_max_position_embeddings == 0 {
                return Err(EngineError::ModelLoad(format!(
                    "model config: YaRN with factor {factor} over an original context of {original_max_position_embeddings} positions is not usable"
                )));
            }
        }
        if self.scales.query_temperature.is_some_and(|temperature| temperature.length == 0) {
            return Err(EngineError::ModelLoad("model config: the query temperature's length must be positive".into()));
        }
        if let Some(net) = &self.gated_delta_net {
            let shape = [net.key_heads, net.value_heads, net.key_head_dim, net.value_head_dim, net.conv_kernel];
            if shape.contains(&0) || !net.value_heads.is_multiple_of(net.key_heads) || net.layers.iter().any(|&layer| layer >= self.num_hidden_layers) {
                return Err(EngineError::ModelLoad(format!("model config: Gated DeltaNet layers {net:?} of {} are not usable", self.num_hidden_layers)));
            }
        }
        if let Some(mamba) = &self.mamba2 {
            let shape = [mamba.heads, mamba.head_dim, mamba.state_size, mamba.groups, mamba.conv_kernel];
            let overlapping = self.gated_delta_net.as_ref().is_some_and(|net| net.layers.iter().any(|layer| mamba.layers.contains(layer)));
            if shape.contains(&0)
                || !mamba.heads.is_multiple_of(mamba.groups)
                || mamba.layers.iter().any(|&layer| layer >= self.num_hidden_layers)
                || overlapping
            {
                return Err(EngineError::ModelLoad(format!("model config: Mamba-2 layers {mamba:?} of {} are not usable", self.num_hidden_layers)));
            }
        }
        if let Some(window) = &self.sliding_window {
            if window.size == 0 || window.layers.iter().any(|&layer| layer >= self.num_hidden_layers) {
                return Err(EngineError::ModelLoad(format!(
                    "model config: a sliding window of {} positions over layers {:?} of {} is not usable",
                    window.size, window.layers, self.num_hidden_layers
                )));
            }
        }
        Ok(())
    }

    pub fn q_size(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    /// Whether `layer` attends within a sliding window.
    pub fn is_sliding(&self, layer: usize) -> bool {
        self.sliding_window.as_ref().is_some_and(|window| window.layers.contains(&layer))
    }

    pub fn kv_size(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// Values of one sequence's recurrent state in `layer`: 0 for a layer that attends.
    pub fn state_len(&self, layer: usize) -> usize {
        let delta_net = self.gated_delta_net.as_ref().filter(|net| net.layers.contains(&layer)).map(GatedDeltaNet::state_len);
        let mamba = self.mamba2.as_ref().filter(|mamba| mamba.layers.contains(&layer)).map(Mamba2::state_len);
        delta_net.or(mamba).unwrap_or(0)
    }

    /// Whether `layer` keeps a recurrent state in place of KV pages.
    pub fn is_recurrent(&self, layer: usize) -> bool {
        self.state_len(layer) > 0
    }

    /// Whether any layer keeps a recurrent state.
    pub fn has_recurrent_layers(&self) -> bool {
        self.state_bytes() > 0
    }

    /// The layers that attend (and keep KV pages).
    pub fn attention_layers(&self) -> usize {
        (0..self.num_hidden_layers).filter(|&layer| !self.is_recurrent(layer)).count()
    }

    /// The width of the value rows the KV pages keep per kv head: `head_dim`, or none where the
    /// values are the keys' latent part (multi-head latent attention).
    pub fn stored_value_dim(&self) -> usize {
        if self.latent_attention.is_some() {
            0
        } else {
            self.head_dim
        }
    }

    /// The width of each kv head's values as attention reads them (its output per query head).
    pub fn value_dim(&self) -> usize {
        self.latent_attention.as_ref().map_or(self.head_dim, |latent| latent.kv_lora_rank)
    }

    /// Bytes of K and V one token occupies in the cache, over all layers.
    pub fn kv_bytes_per_token(&self, dtype: KvCacheDtype) -> usize {
        let values = match self.stored_value_dim() {
            0 => 0,
            dim => dtype.row_bytes(dim),
        };
        self.attention_layers() * self.num_key_value_heads * (dtype.row_bytes(self.head_dim) + values)
    }

    /// Bytes of one sequence's recurrent state over all layers (float32); 0 without such layers.
    pub fn state_bytes(&self) -> usize {
        (0..self.num_hidden_layers).map(|layer| self.state_len(layer)).sum::<usize>() * std::mem::size_of::<f32>()
    }
}

/// An f32 as the shortest decimal that reads back as it, the way config files write it (1e-5,
/// not the 9.99999974e-6 its widening to f64 gives).
fn as_written<S: Serializer>(value: &f32, serializer: S) -> std::result::Result<S::Ok, S::Error> {
    serializer.serialize_f64(value.to_string().parse().expect("a float's text parses"))
}

fn option_as_written<S: Serializer>(value: &Option<f32>, serializer: S) -> std::result::Result<S::Ok, S::Error> {
    match value {
        Some(value) => as_written(value, serializer),
        None => serializer.serialize_none(),
    }
}

/// Weight precision. Activations stay f32 (kernels with bf16 dot products round them to bf16).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    #[default]
    Float32,
    Bfloat16,
    Float16,
}

impl Dtype {
    pub fn weight_dtype(self) -> WeightDtype {
        match self {
            Dtype::Float32 => WeightDtype::F32,
            Dtype::Bfloat16 => WeightDtype::BF16,
            Dtype::Float16 => WeightDtype::F16,
        }
    }
}

/// Element type of the KV pages. Attention computes in f32 whatever they hold; bfloat16 halves
/// the bytes a token's K and V take (twice the tokens in the same memory) and the bytes decode
/// attention reads, int8 (symmetric, a scale per token and kv head) quarters them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtype {
    #[default]
    Float32,
    Bfloat16,
    Int8,
}

impl KvCacheDtype {
    /// Bytes of one row of `head_dim` elements (one token's K or V in one kv head).
    pub fn row_bytes(self, head_dim: usize) -> usize {
        match self {
            KvCacheDtype::Float32 => 4 * head_dim,
            KvCacheDtype::Bfloat16 => 2 * head_dim,
            KvCacheDtype::Int8 => head_dim + std::mem::size_of::<f32>(),
        }
    }
}

/// Weight quantization applied when the model is built.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, JsonSchema)]
pub enum Quantization {
    /// int8 weights with one scale per output channel and int8 activations with one scale per
    /// token, quantized on the fly (SGLang's `w8a8_int8`).
    #[serde(rename = "w8a8_int8")]
    W8A8Int8,
    /// 4-bit weights in groups of 32 inputs with a scale and a minimum each, quantized at load
    /// from 16- or 32-bit weights; int8 activations per group (see `rsgl_kernels::int4`).
    #[serde(rename = "w4a8")]
    W4A8,
    /// A GGUF file's quantized blocks packed as they are for the integer kernels (Q4_0, Q4_1, Q4_K
    /// as W4A8); a layer stored in a type without such kernels runs in `dtype` (vLLM's `gguf`).
    #[serde(rename = "gguf")]
    Gguf,
    /// An AWQ checkpoint's 4-bit groups (zero point and scale per group of inputs) packed as
    /// they are for the W4A8 kernels (SGLang's `awq`).
    #[serde(rename = "awq")]
    Awq,
    /// A GPTQ checkpoint's 4-bit groups packed as they are for the W4A8 kernels; act-order
    /// layers, whose groups are not runs of inputs, run in `dtype` (SGLang's `gptq`).
    #[serde(rename = "gptq")]
    Gptq,
    /// An MXFP4 checkpoint's e2m1 blocks (gpt-oss's experts) packed as they are for the W4A8
    /// kernels, its other layers in `dtype` (transformers' `mxfp4`).
    #[serde(rename = "mxfp4")]
    Mxfp4,
}

impl Quantization {
    /// Whether the checkpoint chose each layer's format (GGUF, AWQ, GPTQ, MXFP4 files): a layer runs as
    /// stored where kernels take its type, in `dtype` elsewhere, the lm_head included.
    pub fn as_stored(self) -> bool {
        matches!(self, Quantization::Gguf | Quantization::Awq | Quantization::Gptq | Quantization::Mxfp4)
    }
}

/// Engine options, named after SGLang's server arguments where one exists. The source of every
/// other statement of them: `scripts/gen_options.py` turns [`EngineOptions::json_schema`] (these
/// doc comments, the types, the defaults) into the Python package's option types, the server's
/// flags and the docs' option table. So each doc comment is the option's help text, written for
/// users.
#[derive(Debug, Clone, Deserialize, Serialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EngineOptions {
    /// The longest prompt + output a request may have, in tokens; the model's limit when unset.
    pub context_length: Option<usize>,
    /// Tokens per KV page.
    pub page_size: usize,
    /// The KV pool's size in tokens; when unset, as many as `kv_cache_memory_gb` holds.
    pub max_total_tokens: Option<usize>,
    /// The KV pool's memory budget in GiB (when `max_total_tokens` is unset).
    pub kv_cache_memory_gb: f64,
    /// Element type of the KV pages: bfloat16 holds twice float32's tokens in the same memory,
    /// int8 (a scale per token and kv head) almost four times. Attention computes in float32.
    pub kv_cache_dtype: KvCacheDtype,
    /// The most requests decoding together.
    pub max_running_requests: usize,
    /// The most prompt tokens prefilled in one step (longer prompts are prefilled in chunks).
    pub chunked_prefill_size: usize,
    /// Compute threads; 0: one per physical core.
    pub threads: usize,
    /// Pins each compute thread to its own core.
    pub pin_threads: bool,
    /// Tensor-parallel ranks: each holds a slice of every layer and of the KV cache (whole kv
    /// heads) and runs on its own share of the threads, one NUMA node each where there are
    /// enough; partial sums are added in shared memory. At most the model's kv heads.
    pub tp_size: usize,
    /// Precision the weights are held and multiplied in (with `quantization`: the embedding's and
    /// the lm_head's).
    pub dtype: Dtype,
    /// Quantizes the linear layers at load (w8a8_int8: int8 weights per channel, int8 activations
    /// per token; w4a8: 4-bit weights in groups of 32, int8 activations per group), or runs a
    /// checkpoint's quantized weights as they are stored (gguf, awq, gptq, mxfp4).
    pub quantization: Option<Quantization>,
    /// With `quantization`, quantizes the lm_head too (and a tied embedding with it).
    pub quantize_lm_head: bool,
    /// Bits of the activations of the 4-bit and 8-bit quantized layers: 8 (int8 per block of 32,
    /// as llama.cpp) or 16 (int8 plus its rounding residual: closer to float answers, slower
    /// prefill).
    pub activation_bits: u8,
    /// The seed of the per-request seeds of requests that give none.
    pub random_seed: u64,
    /// Order of admission: fcfs (arrival), lpm (longest cached prefix first) or dfs-weight
    /// (requests sharing prefixes together).
    pub schedule_policy: SchedulePolicy,
    /// How much of the running requests' remaining output admission keeps KV pages for, relative
    /// to SGLang's default estimate: higher admits fewer requests at once and retracts fewer, 0
    /// keeps none back.
    pub schedule_conservativeness: f64,
    /// Turns prefix sharing off (every request computes its whole prompt).
    pub disable_radix_cache: bool,
    /// Constrained requests sample every token, even text their grammar forces.
    pub disable_jump_forward: bool,
    /// Threads compiling grammars (off the engine thread).
    pub grammar_compile_threads: usize,
    /// Serves embeddings instead of generating: the model's final hidden states are pooled (as
    /// its config says, else the last token's) and L2-normalized; no lm_head is loaded.
    pub is_embedding: bool,
    /// Speculative decoding without a draft model: ngram (prompt lookup) or suffix
    /// (SuffixDecoding over the request and recent outputs); each decode pass also verifies the
    /// drafted tokens, the output unchanged. Off when unset.
    pub speculative_algorithm: Option<SpeculativeAlgorithm>,
    /// The most draft tokens a request verifies per step.
    pub speculative_num_draft_tokens: usize,
    /// Verifies only the draft tokens worth their rows by the step cost fitted while running;
    /// false verifies every draft token.
    // The cost model: `speculative::StepCost::budget`.
    pub speculative_draft_budget: bool,
    /// Keeps every computed KV page also in a file in this folder (the prefix cache's disk tier):
    /// prompts whose prefix memory no longer holds read it back instead of recomputing it, also
    /// after a restart. Off when unset.
    pub hicache_dir: Option<String>,
    /// The most GiB the disk tier's file takes; the least recently used pages make room.
    pub hicache_size_gb: f64,
    /// For models with sliding-window layers (Gemma 2 and 3), which keep only their window's KV
    /// in pages of their own: tokens of that pool per token of the global layers' pool, the KV
    /// budget split to give both.
    pub swa_full_tokens_ratio: f64,
    /// For models with recurrent layers (Qwen3.5, Qwen3-Next, Granite 4.0-H): how many requests
    /// hold a recurrent state at once; when unset, one per running request within the share of
    /// `kv_cache_memory_gb` that `mamba_full_memory_ratio` gives the states, whose bytes come out
    /// of it.
    pub max_mamba_cache_size: Option<usize>,
    /// For models with recurrent layers, when `max_mamba_cache_size` is unset: the most memory
    /// the recurrent states may take per byte left to the KV pages (1: up to half of
    /// `kv_cache_memory_gb`; SGLang defaults to 0.9). Raise it to run more requests at once with
    /// large states, lower it to keep more tokens of KV.
    pub mamba_full_memory_ratio: f64,
    /// LoRA adapters requests may name (`lora_path`), each a name and the PEFT folder holding
    /// its `adapter_config.json` and `adapter_model.safetensors`, or a GGUF LoRA file (as
    /// llama.cpp's `--lora` takes). docs/lora.md lists the models that take them.
    pub lora_paths: BTreeMap<String, String>,
    /// The most LoRA adapters the running requests use at once; a request for another waits.
    pub max_loras_per_batch: usize,
    /// The highest rank a LoRA adapter may have (larger ones are refused, at start or when
    /// loaded at run time); any when unset.
    pub max_lora_rank: Option<usize>,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            context_length: None,
            page_size: 16,
            max_total_tokens: None,
            kv_cache_memory_gb: 1.0,
            kv_cache_dtype: KvCacheDtype::Float32,
            max_running_requests: 64,
            chunked_prefill_size: 2048,
            threads: 0,
            pin_threads: true,
            tp_size: 1,
            dtype: Dtype::Float32,
            quantization: None,
            quantize_lm_head: false,
            activation_bits: 8,
            random_seed: 0,
            schedule_policy: SchedulePolicy::Fcfs,
            schedule_conservativeness: 1.0,
            disable_radix_cache: false,
            disable_jump_forward: false,
            grammar_compile_threads: 2,
            is_embedding: false,
            speculative_algorithm: None,
            speculative_num_draft_tokens: 4,
            speculative_draft_budget: true,
            hicache_dir: None,
            hicache_size_gb: 16.0,
            swa_full_tokens_ratio: 0.8,
            max_mamba_cache_size: None,
            mamba_full_memory_ratio: 1.0,
            lora_paths: BTreeMap::new(),
            max_loras_per_batch: 8,
            max_lora_rank: None,
        }
    }
}

impl EngineOptions {
    /// The options' JSON Schema: each one's type, default and help (its doc comment).
    pub fn json_schema() -> serde_json::Value {
        schemars::schema_for!(EngineOptions).to_value()
    }

    pub fn from_json(json: &str) -> Result<Self> {
        Self::deserialize_from(&mut serde_json::Deserializer::from_str(json))
    }

    /// From any serde source: JSON text, or the Python objects the binding passes.
    pub fn deserialize_from<'de, D: Deserializer<'de>>(de: D) -> Result<Self> {
        let opts: EngineOptions = deserialize_with_path(de).map_err(|e| EngineError::InvalidRequest(format!("engine options: {e}")))?;
        let must_be_positive = [
            ("page_size", opts.page_size),
            ("max_running_requests", opts.max_running_requests),
            ("chunked_prefill_size", opts.chunked_prefill_size),
            ("speculative_num_draft_tokens", opts.speculative_num_draft_tokens),
            ("max_mamba_cache_size", opts.max_mamba_cache_size.unwrap_or(1)),
            ("max_loras_per_batch", opts.max_loras_per_batch),
            ("max_lora_rank", opts.max_lora_rank.unwrap_or(1)),
        ];
        if let Some((name, _)) = must_be_positive.iter().find(|(_, v)| *v == 0) {
            return Err(EngineError::InvalidRequest(format!("engine option {name} must be at least 1")));
        }
        if !(opts.schedule_conservativeness >= 0.0 && opts.schedule_conservativeness.is_finite()) {
            return Err(EngineError::InvalidRequest("engine option schedule_conservativeness must be 0 or more".into()));
        }
        if opts.kv_cache_memory_gb.is_nan() || opts.kv_cache_memory_gb <= 0.0 {
            return Err(EngineError::InvalidRequest("engine option kv_cache_memory_gb must be positive".into()));
        }
        let positive_ratios = [("swa_full_tokens_ratio", opts.swa_full_tokens_ratio), ("mamba_full_memory_ratio", opts.mamba_full_memory_ratio)];
        if let Some((name, _)) = positive_ratios.iter().find(|(_, ratio)| !(*ratio > 0.0 && ratio.is_finite())) {
            return Err(EngineError::InvalidRequest(format!("engine option {name} must be positive")));
        }
        if opts.hicache_size_gb.is_nan() || opts.hicache_size_gb <= 0.0 {
            return Err(EngineError::InvalidRequest("engine option hicache_size_gb must be positive".into()));
        }
        if opts.hicache_dir.is_some() && opts.disable_radix_cache {
            return Err(EngineError::InvalidRequest("hicache_dir keeps the radix cache's pages on disk; it cannot be used with disable_radix_cache".into()));
        }
        if ![8, 16].contains(&opts.activation_bits) {
            return Err(EngineError::InvalidRequest(format!("engine option activation_bits must be 8 or 16, not {}", opts.activation_bits)));
        }
        Ok(opts)
    }

    /// How finely the block layers quantize their activations.
    pub fn activation_bits(&self) -> ActivationBits {
        if self.activation_bits == 16 {
            ActivationBits::Sixteen
        } else {
            ActivationBits::Eight
        }
    }

    pub fn context_length(&self, cfg: &ModelConfig) -> usize {
        self.context_length.unwrap_or(cfg.max_position_embeddings)
    }

    /// The sliding window whose layers keep only its KV, in window pages of their own: the
    /// model's, where it is shorter than the context (a longer one never slides past a page).
    pub fn paged_window<'c>(&self, cfg: &'c ModelConfig) -> Option<&'c SlidingWindow> {
        cfg.sliding_window.as_ref().filter(|window| window.size < self.context_length(cfg))
    }

    /// Most draft tokens a request verifies in one step (0 without speculative decoding).
    pub fn max_draft_tokens(&self) -> usize {
        self.speculative_algorithm.map_or(0, |_| self.speculative_num_draft_tokens)
    }

    /// How many pages the KV pools get: `max_total_tokens` (else what `kv_cache_memory_gb` holds)
    /// of every layer; with a [`Self::paged_window`], of the global layers, beside
    /// `swa_full_tokens_ratio` as many (at least one request's window) of the sliding ones.
    pub fn kv_pools(&self, cfg: &ModelConfig) -> Pools {
        let state_slots = self.state_slots(cfg);
        // The recurrent states come out of the budget first.
        let budget = (self.kv_cache_memory_gb * (1u64 << 30) as f64 - (state_slots * cfg.state_bytes()) as f64).max(0.0);
        let Some(window) = self.paged_window(cfg) else {
            let tokens = self.max_total_tokens.unwrap_or_else(|| (budget / cfg.kv_bytes_per_token(self.kv_cache_dtype) as f64) as usize);
            return Pools { pages: tokens.div_ceil(self.page_size), window_pages: None, state_slots };
        };
        let layer_bytes = (cfg.kv_bytes_per_token(self.kv_cache_dtype) / cfg.attention_layers()) as f64;
        let (sliding, ratio) = (window.layers.len() as f64, self.swa_full_tokens_ratio);
        let global = cfg.attention_layers() as f64 - sliding;
        let tokens = self.max_total_tokens.unwrap_or_else(|| (budget / (layer_bytes * (global + ratio * sliding))) as usize);
        let window_tokens = (tokens as f64 * ratio) as usize;
        let one_request = window_pages_per_request(window.size, self.page_size, self.max_draft_tokens());
        Pools { pages: tokens.div_ceil(self.page_size), window_pages: Some(window_tokens.div_ceil(self.page_size).max(one_request)), state_slots }
    }

    /// How many sequences can hold a recurrent state at once (0 for models without recurrent
    /// layers): `max_mamba_cache_size`, else one per running request, within the states' share
    /// of the memory budget, `mamba_full_memory_ratio` to the KV pages' one (at least one).
    pub fn state_slots(&self, cfg: &ModelConfig) -> usize {
        let bytes = cfg.state_bytes();
        if bytes == 0 {
            return 0;
        }
        self.max_mamba_cache_size.unwrap_or_else(|| {
            let ratio = self.mamba_full_memory_ratio;
            let states_budget = self.kv_cache_memory_gb * (1u64 << 30) as f64 * ratio / (1.0 + ratio);
            self.max_running_requests.min((states_budget / bytes as f64) as usize).max(1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engine_options_schema_gives_every_option_its_help_and_default() {
        let schema = EngineOptions::json_schema();
        let properties = schema["properties"].as_object().expect("the options' properties");
        let defaults = serde_json::to_value(EngineOptions::default()).expect("the defaults serialize");
        assert_eq!(properties.keys().collect::<Vec<_>>(), defaults.as_object().expect("an object").keys().collect::<Vec<_>>());
        for (name, property) in properties {
            assert!(property["description"].as_str().is_some_and(|help| !help.is_empty()), "{name} has no doc comment");
            assert_eq!(property.get("default"), Some(&defaults[name]), "{name}");
        }
        let kv_cache_dtype = &schema["$defs"]["KvCacheDtype"];
        assert_eq!(kv_cache_dtype["enum"], serde_json::json!(["float32", "bfloat16", "int8"]), "{kv_cache_dtype}");
    }

    /// Two layers, the first a Mamba-2 layer whose state takes 320 bytes per sequence.
    fn hybrid_config() -> ModelConfig {
        ModelConfig::from_json(
            r#"{"architecture": "granitemoehybrid", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 8,
            "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 4,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "rope_scaling": null, "attention_bias": false,
            "qk_norm": false, "tie_word_embeddings": false, "max_position_embeddings": 16,
            "mamba2": {"layers": [0], "heads": 2, "head_dim": 4, "state_size": 4, "groups": 1, "conv_kernel": 4}}"#,
        )
        .expect("a tiny hybrid config")
    }

    #[test]
    fn mamba_full_memory_ratio_splits_the_budget_between_states_and_kv_pages() {
        let cfg = hybrid_config();
        assert_eq!(cfg.state_bytes(), 320);
        let budget = 3200.0 / (1u64 << 30) as f64;
        let options_of = |ratio: f64| EngineOptions { kv_cache_memory_gb: budget, mamba_full_memory_ratio: ratio, ..EngineOptions::default() };
        // The states take up to ratio / (1 + ratio) of the 3,200 bytes, whole states of 320 each.
        let slots: Vec<usize> = [1.0, 3.0, 0.25, 0.01].into_iter().map(|ratio| options_of(ratio).state_slots(&cfg)).collect();
        assert_eq!(slots, [5, 7, 2, 1]);
        // What the states take more, the KV pages lose (64 bytes a token, 16 tokens a page): 1,600
        // bytes left are 25 tokens in 2 pages, 960 bytes 15 tokens in 1.
        assert_eq!(cfg.kv_bytes_per_token(KvCacheDtype::Float32), 64);
        assert_eq!([1.0, 3.0].map(|ratio| options_of(ratio).kv_pools(&cfg).pages), [2, 1]);
        for ratio in ["0", "-1"] {
            let refused = EngineOptions::from_json(&format!(r#"{{"mamba_full_memory_ratio": {ratio}}}"#)).expect_err(ratio).to_string();
            assert!(refused.contains("mamba_full_memory_ratio must be positive"), "{refused}");
        }
    }

    #[test]
    fn engine_options_read_back_what_they_write() {
        let options = EngineOptions { context_length: Some(512), quantization: Some(Quantization::W4A8), ..EngineOptions::default() };
        let read = EngineOptions::from_json(&serde_json::to_string(&options).expect("options serialize")).expect("options read back");
        assert_eq!(format!("{read:?}"), format!("{options:?}"));
    }
}
