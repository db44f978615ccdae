//! A transformers config.json (4.x or 5.x layout) mapped onto the normalized config, refusing
//! the variants the runner does not implement.

use super::architecture::{Architecture, MoeFacts, RecurrentMixer};
use super::keys::{quoted, truthy, Keys};
use super::vision;
use super::{
    Activation, ExpertGroups, ExpertScoring, GatedDeltaNet, GroupScore, LatentAttention, Mamba2, ModelConfig, MoeConfig, QueryTemperature, RopeScaling, Scales,
    SlidingWindow, ValueHeadOrder,
};
use crate::error::{EngineError, Result};
use crate::model::archs::QkNorm;
use crate::pooling::Pooling;
use serde::{Deserialize, Deserializer};
use serde_json::{Map, Value};

const LLAMA3_ROPE_KEYS: [&str; 4] = ["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"];
const REMEDY: &str = "the config looks broken: download the model again";

impl ModelConfig {
    /// With what a checkpoint's files beside config.json say: the pooling sentence-transformers
    /// declares, and whether there is an `lm_head` (without one the output projection can only
    /// be the embedding, whatever `tie_word_embeddings` says).
    pub fn with_checkpoint(self, pooling: Option<Pooling>, has_lm_head: bool) -> Self {
        ModelConfig { pooling, tie_word_embeddings: self.tie_word_embeddings || !has_lm_head, ..self }
    }

    /// The normalized config of a transformers config.json, from its JSON text, a parsed
    /// `serde_json::Value` or the dict the binding passes.
    pub fn from_hf_config<'de, D: Deserializer<'de>>(de: D) -> Result<Self> {
        let raw = Map::<String, Value>::deserialize(de)
            .map_err(|e| EngineError::ModelLoad(format!("config.json holds no JSON object ({e}); download the model again.")))?;
        let vision = vision::vision_config(&raw, REMEDY)?;
        let raw = language_model_config(raw)?;
        let hf = Keys::new(&raw, "config.json".into(), REMEDY);
        let architecture = architecture(&hf)?;
        if hf.flag("mlp_bias") {
            return Err(EngineError::UnsupportedModel("this model has MLP biases (mlp_bias=true), which rsgl does not support yet.".into()));
        }
        let (rope_theta, rope_scaling) = rope(&hf)?;
        let hidden_size = hf.count("hidden_size")?;
        let num_attention_heads = hf.count("num_attention_heads")?;
        let num_hidden_layers = hf.count("num_hidden_layers")?;
        // Zero heads: validate() says so.
        let head_dim = hf.optional_count("head_dim")?.unwrap_or(hidden_size.checked_div(num_attention_heads).unwrap_or(0));
        let latent_attention = latent_attention(&hf)?;
        let activation = activation(&hf, architecture)?;
        let recurrent = recurrent_layers(&hf, architecture, num_hidden_layers)?;
        let (gated_delta_net, mamba2) = match architecture.recurrent_mixer {
            Some(RecurrentMixer::GatedDeltaNet) => (gated_delta_net(&hf, recurrent)?, None),
            Some(RecurrentMixer::Mamba2) => (None, mamba2(&hf, recurrent, hidden_size, activation)?),
            None => (None, None),
        };
        let mut scales = scales(&hf, architecture, hidden_size)?;
        // Latent pages hold one kv head: the latent and the rope key (see `ModelConfig::latent_attention`).
        let (num_key_value_heads, head_dim, rotary_dim) = match &latent_attention {
            Some(latent) => {
                scales.attention = Some(latent_attention_scale(latent, rope_scaling_keys(&hf))?);
                (1, latent.latent_key_dim(), Some(latent.qk_rope_head_dim))
            }
            None => (hf.optional_count("num_key_value_heads")?.unwrap_or(num_attention_heads), head_dim, rotary_dim(&hf, head_dim)?),
        };
        let config = ModelConfig {
            architecture: architecture.name.into(),
            hidden_size,
            intermediate_size: hf.count(architecture.ffn_key)?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            vocab_size: hf.count("vocab_size")?,
            rms_norm_eps: hf.number("rms_norm_eps")?.unwrap_or(1e-6) as f32,
            rope_theta,
            rope_scaling,
            rotary_dim,
            attention_bias: architecture.attention_bias || hf.flag("attention_bias"),
            // GLM-4.5's configs say whether it normalizes q and k.
            qk_norm: architecture.assembly.qk_norm != QkNorm::None && hf.get("use_qk_norm").is_none_or(truthy),
            tie_word_embeddings: hf.flag("tie_word_embeddings"),
            max_position_embeddings: context_limit(&hf, architecture)?,
            moe: architecture.moe.as_ref().map(|facts| moe(&hf, facts)).transpose()?.flatten(),
            // In sentence-transformers' files next to config.json, which the loader reads.
            pooling: None,
            scales,
            no_rope_layers: no_rope_layers(&hf, num_hidden_layers)?,
            sliding_window: sliding_window(&hf, architecture, num_hidden_layers)?,
            activation,
            norm_weight_offset: architecture.assembly.norm_weight_offset,
            gated_delta_net,
            mamba2,
            latent_attention,
            vision,
        };
        config.validate()?;
        Ok(config)
    }
}

/// A vision-language checkpoint's language model, which rsgl runs on text (Gemma 3 4B and up):
/// its `text_config` over its config class's defaults, which transformers 4 leaves out of nested
/// configs (Gemma 3 4B's lists 6 keys), named by its `model_type`. Other configs as they are.
fn language_model_config(mut raw: Map<String, Value>) -> Result<Map<String, Value>> {
    let Some(Value::Object(text)) = raw.remove("text_config") else { return Ok(raw) };
    let model_type = text.get("model_type").and_then(Value::as_str).unwrap_or_default();
    let architecture = Architecture::named(model_type).ok_or_else(|| {
        EngineError::UnsupportedModel(format!(
            "rsgl does not support this model's language model ({}); it runs {}.",
            quoted(&Value::from(model_type)),
            Architecture::list(|a| Some(a.name))
        ))
    })?;
    let mut config = match architecture.nested_config_defaults {
        Some(defaults) => serde_json::from_str(defaults).expect("the architecture table's defaults are JSON"),
        None => Map::new(),
    };
    // Where the language model does not say, the whole model's config does.
    config.extend(raw.into_iter().filter(|(key, _)| key == "tie_word_embeddings"));
    config.extend(text);
    // Named by its model_type: SmolVLM's text config names a class of its own (VLlama3ForCausalLM).
    config.remove("architectures");
    Ok(config)
}

fn architecture(hf: &Keys) -> Result<&'static Architecture> {
    let class = hf.set("architectures").and_then(|classes| classes.get(0));
    let model_type = hf.get("model_type");
    let found = match class {
        Some(class) => class.as_str().and_then(Architecture::with_hf_class),
        None => model_type.and_then(Value::as_str).and_then(Architecture::named),
    };
    found.ok_or_else(|| {
        let named = class.or(model_type).map_or_else(|| "an unnamed architecture".into(), |name| format!("the {} architecture", quoted(name)));
        EngineError::UnsupportedModel(format!("rsgl does not support {named}; it runs {}.", Architecture::list(|a| Some(a.hf_class))))
    })
}

/// The activation config.json names (Gemma's key is `hidden_activation`), else the family's.
fn activation(hf: &Keys, architecture: &Architecture) -> Result<Activation> {
    // gpt-oss's experts ignore `hidden_act` ("silu"): their clamp and slope are fixed.
    if architecture.assembly.activation == Activation::ClampedSwiglu {
        let (limit, alpha) = (hf.number("swiglu_limit")?, hf.number("swiglu_alpha")?);
        if limit.is_some_and(|l| l != 7.0) || alpha.is_some_and(|a| (a - 1.702).abs() > 1e-6) {
            return Err(EngineError::UnsupportedModel("this gpt-oss model's SwiGLU limit or slope is not 7 and 1.702, the only ones rsgl runs.".into()));
        }
        return Ok(Activation::ClampedSwiglu);
    }
    let Some(named) = hf.set("hidden_activation").or_else(|| hf.set("hidden_act")) else { return Ok(architecture.assembly.activation) };
    match named.as_str() {
        Some("silu" | "swish") => Ok(Activation::Silu),
        Some("gelu_pytorch_tanh") => Ok(Activation::GeluTanh),
        _ => Err(EngineError::UnsupportedModel(format!("this model uses the {} activation; rsgl runs 'silu' and 'gelu_pytorch_tanh' models.", quoted(named)))),
    }
}

/// The global layers' `rope_parameters` (transformers 5.x; by layer kind for Gemma 3).
fn rope_parameters<'a>(hf: &Keys<'a>) -> Option<&'a Map<String, Value>> {
    let parameters = hf.set("rope_parameters").and_then(Value::as_object);
    parameters.map(|all| all.get("full_attention").and_then(Value::as_object).unwrap_or(all))
}

/// The global layers' rope scaling: transformers 4.x's `rope_scaling`, else 5.x's `rope_parameters`.
fn rope_scaling_keys<'a>(hf: &Keys<'a>) -> Option<Keys<'a>> {
    let scaling = hf.set("rope_scaling").and_then(Value::as_object).or(rope_parameters(hf))?;
    Some(Keys::new(scaling, "config.json's rope scaling".into(), REMEDY))
}

/// The context a scaled rope was trained on, as transformers 5 settles it: the top-level key
/// (Phi-3 keeps it there), else the scaling's, else the model's context.
fn original_context(hf: &Keys, scaling: &Keys) -> Result<usize> {
    const KEY: &str = "original_max_position_embeddings";
    match [hf, scaling].into_iter().find(|keys| keys.get(KEY).is_some()) {
        Some(keys) => keys.count(KEY),
        None => hf.count("max_position_embeddings"),
    }
}

/// (rope_theta, rope_scaling) of the global layers: transformers 4.x keeps them top-level, 5.x
/// in `rope_parameters`.
fn rope(hf: &Keys) -> Result<(f64, Option<RopeScaling>)> {
    let parameters = rope_parameters(hf);
    let theta = match parameters {
        Some(parameters) if parameters.contains_key("rope_theta") => {
            Keys::new(parameters, "config.json's rope_parameters".into(), REMEDY).required_number("rope_theta")?
        }
        _ => hf.number("rope_theta")?.unwrap_or(10000.0),
    };
    let Some(scaling) = rope_scaling_keys(hf) else { return Ok((theta, None)) };
    match scaling.get("rope_type").or_else(|| scaling.get("type")) {
        None => Ok((theta, None)),
        // M-RoPE's frequencies are the default ones, split by position part (`ImageEncoder::mrope_section`).
        Some(kind) if kind == "default" || kind == "mrope" => Ok((theta, None)),
        Some(kind) if kind == "llama3" => Ok((theta, Some(llama3_scaling(hf, &scaling)?))),
        Some(kind) if kind == "longrope" || kind == "su" => Ok((theta, Some(longrope_scaling(hf, &scaling)?))),
        Some(kind) if kind == "yarn" => Ok((theta, Some(yarn_scaling(hf, &scaling)?))),
        Some(kind) if kind == "linear" => {
            let factor = scaling.number("factor")?.ok_or_else(|| hf.broken("config.json: linear RoPE scaling lacks its factor".into()))?;
            Ok((theta, Some(RopeScaling::Linear { factor })))
        }
        Some(kind) => Err(EngineError::UnsupportedModel(format!(
            "rsgl does not support {} RoPE scaling yet; it supports 'linear', 'llama3', 'longrope' and 'yarn' scaling.",
            quoted(kind)
        ))),
    }
}

fn llama3_scaling(hf: &Keys, scaling: &Keys) -> Result<RopeScaling> {
    let values = LLAMA3_ROPE_KEYS.map(|key| scaling.get(key).and_then(Value::as_f64));
    let [Some(factor), Some(low_freq_factor), Some(high_freq_factor), Some(original_max_position_embeddings)] = values else {
        let missing: Vec<&str> = LLAMA3_ROPE_KEYS.iter().zip(values).filter(|(_, value)| value.is_none()).map(|(key, _)| *key).collect();
        return Err(hf.broken(format!("config.json: llama3 RoPE scaling lacks {}", missing.join(", "))));
    };
    Ok(RopeScaling::Llama3 { factor, low_freq_factor, high_freq_factor, original_max_position_embeddings })
}

/// Phi-3's LongRoPE, as transformers computes it: the factors of each frequency, the original
/// context, and the attention factor (given, else sqrt(1 + ln(factor) / ln(original)) of the
/// context's growth `factor`).
fn longrope_scaling(hf: &Keys, scaling: &Keys) -> Result<RopeScaling> {
    let factors = |key: &str| -> Result<Vec<f64>> {
        let values = scaling.required(key)?.as_array().ok_or_else(|| hf.broken(format!("config.json: LongRoPE's {key} is not a list")))?;
        values.iter().map(|value| value.as_f64().ok_or_else(|| hf.broken(format!("config.json: LongRoPE's {key} holds a non-number")))).collect()
    };
    let original = original_context(hf, scaling)?;
    let factor = growth_factor(hf, scaling, original)?;
    let attention_factor = match scaling.number("attention_factor")? {
        Some(given) => given,
        None if factor <= 1.0 => 1.0,
        None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
    };
    Ok(RopeScaling::LongRope {
        short_factor: factors("short_factor")?,
        long_factor: factors("long_factor")?,
        original_max_position_embeddings: original,
        attention_factor,
    })
}

/// The scaling's `factor`, else how many times the original context the model's is.
fn growth_factor(hf: &Keys, scaling: &Keys, original: usize) -> Result<f64> {
    match scaling.number("factor")? {
        Some(factor) => Ok(factor),
        None => Ok(hf.count("max_position_embeddings")? as f64 / original as f64),
    }
}

/// YaRN, as transformers computes it: the blend's bounds `beta_fast` and `beta_slow` (32 and 1
/// unless set), rounded out unless `truncate` is false, and the attention factor (given, else
/// derived from the growth factor and DeepSeek's mscales).
fn yarn_scaling(hf: &Keys, scaling: &Keys) -> Result<RopeScaling> {
    let original = original_context(hf, scaling)?;
    let factor = growth_factor(hf, scaling, original)?;
    let beta = |key: &str, default: f64| -> Result<f64> { Ok(scaling.number(key)?.filter(|beta| *beta != 0.0).unwrap_or(default)) };
    let attention_factor = match scaling.number("attention_factor")? {
        Some(given) => given,
        None => RopeScaling::yarn_attention_factor(factor, scaling.number("mscale")?, scaling.number("mscale_all_dim")?),
    };
    Ok(RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: original,
        beta_fast: beta("beta_fast", 32.0)?,
        beta_slow: beta("beta_slow", 1.0)?,
        truncate: scaling.get("truncate").is_none_or(truthy),
        attention_factor,
    })
}

/// Ministral 3's `llama_4_scaling_beta`, beside its rope scaling, over the original context.
fn query_temperature(hf: &Keys) -> Result<Option<QueryTemperature>> {
    let Some(scaling) = rope_scaling_keys(hf) else { return Ok(None) };
    let Some(beta) = scaling.number("llama_4_scaling_beta")?.filter(|beta| *beta != 0.0) else { return Ok(None) };
    Ok(Some(QueryTemperature { beta: beta as f32, length: original_context(hf, &scaling)? }))
}

/// How many of each head's dimensions rope rotates, where `partial_rotary_factor` (in
/// `rope_parameters` in transformers 5) says fewer than all.
fn rotary_dim(hf: &Keys, head_dim: usize) -> Result<Option<usize>> {
    let in_parameters = hf.set("rope_parameters").and_then(|parameters| parameters.get("partial_rotary_factor")).and_then(Value::as_f64);
    let factor = match in_parameters {
        Some(factor) => Some(factor),
        None => hf.number("partial_rotary_factor")?,
    };
    Ok(factor.map(|factor| (head_dim as f64 * factor) as usize).filter(|&dim| dim != head_dim))
}

/// The model's context, capped at its sliding window where one applies: the runner attends to
/// every position, which equals sliding-window attention only while a sequence fits the window.
fn context_limit(hf: &Keys, architecture: &Architecture) -> Result<usize> {
    let limit = hf.count("max_position_embeddings")?;
    let window = if architecture.sliding_window || hf.flag("use_sliding_window") { hf.optional_count("sliding_window")? } else { None };
    Ok(window.map_or(limit, |window| limit.min(window)))
}

/// Granite's multipliers and Gemma's scales and soft caps, where the config has them.
fn scales(hf: &Keys, architecture: &Architecture, hidden_size: usize) -> Result<Scales> {
    let one = |key: &str| -> Result<f32> { Ok(hf.number(key)?.unwrap_or(1.0) as f32) };
    let optional = |key: &str| -> Result<Option<f32>> { Ok(hf.number(key)?.map(|value| value as f32)) };
    let embedding = if architecture.assembly.embedding_times_sqrt_hidden { (hidden_size as f32).sqrt() } else { one("embedding_multiplier")? };
    let query_pre_attn_scalar = optional("query_pre_attn_scalar")?.map(|scalar| 1.0 / scalar.sqrt());
    Ok(Scales {
        embedding,
        residual: one("residual_multiplier")?,
        attention: optional("attention_multiplier")?.or(query_pre_attn_scalar),
        logits_divisor: one("logits_scaling")?,
        attention_logit_cap: optional("attn_logit_softcapping")?,
        final_logit_cap: optional("final_logit_softcapping")?,
        query_temperature: query_temperature(hf)?,
    })
}

/// Gemma's sliding layers: as `layer_types` lists them (transformers 5), else all but every
/// `sliding_window_pattern`th (transformers 4: the key, or the family's pattern).
fn sliding_window(hf: &Keys, architecture: &Architecture, layers: usize) -> Result<Option<SlidingWindow>> {
    let (Some(every), Some(size)) = (architecture.global_layer_every, hf.optional_count("sliding_window")?) else { return Ok(None) };
    let sliding: Vec<usize> = match hf.set("layer_types").and_then(Value::as_array) {
        Some(kinds) => kinds.iter().enumerate().filter(|(_, kind)| kind.as_str() == Some("sliding_attention")).map(|(layer, _)| layer).collect(),
        None => {
            let every = hf.optional_count("sliding_window_pattern")?.unwrap_or(every);
            SlidingWindow::all_but_every(every, layers)
        }
    };
    let local_parameters = hf.set("rope_parameters").and_then(|all| all.get("sliding_attention")).and_then(Value::as_object);
    let rope_theta = match local_parameters {
        Some(local) => Keys::new(local, "config.json's rope_parameters.sliding_attention".into(), REMEDY).number("rope_theta")?,
        None => hf.number("rope_local_base_freq")?.or(architecture.local_rope_theta),
    };
    Ok((!sliding.is_empty()).then_some(SlidingWindow { size, layers: sliding, rope_theta }))
}

/// The layers of a hybrid architecture that mix tokens with its recurrent mixer: the
/// `linear_attention` ones of `layer_types` (Granite 4's configs on the Hub say `mamba`, in
/// `layer_types` or `layers_block_type`), else all but every `full_attention_interval`th (Qwen3-Next).
fn recurrent_layers(hf: &Keys, architecture: &Architecture, layers: usize) -> Result<Vec<usize>> {
    if architecture.recurrent_mixer.is_none() {
        return Ok(Vec::new());
    }
    let kinds = hf.set("layer_types").or_else(|| hf.set("layers_block_type")).and_then(Value::as_array);
    Ok(match (kinds, hf.optional_count("full_attention_interval")?) {
        (Some(kinds), _) => {
            kinds.iter().enumerate().filter(|(_, kind)| matches!(kind.as_str(), Some("linear_attention" | "mamba"))).map(|(layer, _)| layer).collect()
        }
        (None, Some(every)) => SlidingWindow::all_but_every(every, layers),
        (None, None) => Vec::new(),
    })
}

/// Qwen3-Next's and Qwen3.5's Gated DeltaNet layers.
fn gated_delta_net(hf: &Keys, layers: Vec<usize>) -> Result<Option<GatedDeltaNet>> {
    if layers.is_empty() {
        return Ok(None);
    }
    Ok(Some(GatedDeltaNet {
        layers,
        key_heads: hf.count("linear_num_key_heads")?,
        value_heads: hf.count("linear_num_value_heads")?,
        key_head_dim: hf.count("linear_key_head_dim")?,
        value_head_dim: hf.count("linear_value_head_dim")?,
        conv_kernel: hf.count("linear_conv_kernel_dim")?,
        value_head_order: ValueHeadOrder::Grouped,
    }))
}

/// Granite 4's Mamba-2 layers, with transformers' defaults for the `mamba_*` keys a config leaves
/// out; their step sizes must be unbounded (`time_step_limit` (0, inf)), as transformers' decode
/// step leaves them, and their convolution's activation SiLU.
fn mamba2(hf: &Keys, layers: Vec<usize>, hidden_size: usize, activation: Activation) -> Result<Option<Mamba2>> {
    if layers.is_empty() {
        return Ok(None);
    }
    if activation != Activation::Silu {
        return Err(EngineError::UnsupportedModel("this model's Mamba-2 layers convolve with an activation other than SiLU, which rsgl does not run.".into()));
    }
    let unbounded = match hf.get("time_step_limit").and_then(Value::as_array).map(Vec::as_slice) {
        None => true,
        // transformers writes infinity as {"__float__": "Infinity"} (JSON has no infinity).
        Some([low, high]) => low.as_f64() == Some(0.0) && high.as_f64().is_none(),
        Some(_) => false,
    };
    if !unbounded {
        return Err(EngineError::UnsupportedModel(format!(
            "this model bounds its Mamba-2 step sizes (time_step_limit {}); rsgl runs them unbounded, (0, inf).",
            hf.get("time_step_limit").map_or_else(String::new, Value::to_string)
        )));
    }
    let heads = hf.optional_count("mamba_n_heads")?.unwrap_or(128);
    let head_dim = match hf.get("mamba_d_head") {
        Some(auto) if auto.as_str() == Some("auto") => None,
        _ => hf.optional_count("mamba_d_head")?,
    };
    let inner = hf.optional_count("mamba_expand")?.unwrap_or(2) * hidden_size;
    Ok(Some(Mamba2 {
        layers,
        heads,
        head_dim: head_dim.unwrap_or(inner.checked_div(heads).unwrap_or(0)),
        state_size: hf.optional_count("mamba_d_state")?.unwrap_or(256),
        groups: hf.optional_count("mamba_n_groups")?.unwrap_or(1),
        conv_kernel: hf.optional_count("mamba_d_conv")?.unwrap_or(4),
    }))
}

/// SmolLM3's `no_rope_layers` (1: the layer uses rope, 0: it does not), as the layers without;
/// every layer where `position_embedding_type` is named but not "rope" (Granite 4's "nope", or
/// null: transformers then builds no rotary embedding).
fn no_rope_layers(hf: &Keys, layers: usize) -> Result<Vec<usize>> {
    if hf.names("position_embedding_type") && hf.get("position_embedding_type").and_then(Value::as_str) != Some("rope") {
        return Ok((0..layers).collect());
    }
    let Some(flags) = hf.set("no_rope_layers") else { return Ok(Vec::new()) };
    let flags = flags.as_array().ok_or_else(|| hf.broken("config.json: no_rope_layers is not a list".into()))?;
    Ok(flags.iter().enumerate().filter(|(_, uses_rope)| uses_rope.as_u64() == Some(0)).map(|(layer, _)| layer).collect())
}

/// Multi-head latent attention, where the config has a `kv_lora_rank` (DeepSeek-V2/V3). Its rope
/// pairs must be interleaved, as DeepSeek's checkpoints store them (`rope_interleave`).
fn latent_attention(hf: &Keys) -> Result<Option<LatentAttention>> {
    if hf.get("kv_lora_rank").is_none_or(Value::is_null) {
        return Ok(None);
    }
    if hf.get("rope_interleave").is_some_and(|interleave| !truthy(interleave)) {
        return Err(EngineError::UnsupportedModel(
            "this model's latent attention rotates rope in halves (rope_interleave false); rsgl runs DeepSeek's interleaved pairs.".into(),
        ));
    }
    let latent = LatentAttention {
        q_lora_rank: hf.optional_count("q_lora_rank")?,
        kv_lora_rank: hf.count("kv_lora_rank")?,
        qk_nope_head_dim: hf.count("qk_nope_head_dim")?,
        qk_rope_head_dim: hf.count("qk_rope_head_dim")?,
        v_head_dim: hf.count("v_head_dim")?,
    };
    if [latent.kv_lora_rank, latent.qk_rope_head_dim, latent.v_head_dim, latent.q_lora_rank.unwrap_or(1)].contains(&0) {
        return Err(hf.broken(format!("config.json: latent attention {latent:?} has an empty part")));
    }
    Ok(Some(latent))
}

/// DeepSeek's attention scale: 1/sqrt(q's head width), times YaRN's `mscale_all_dim` factor squared
/// where the rope is scaled (transformers' `yarn_get_mscale(factor, mscale_all_dim)`).
fn latent_attention_scale(latent: &LatentAttention, scaling: Option<Keys>) -> Result<f32> {
    let Some(scaling) = scaling.filter(|scaling| scaling.get("rope_type").or_else(|| scaling.get("type")).is_some_and(|kind| kind != "default")) else {
        return Ok(latent.attention_scale(1.0));
    };
    let mscale = match (scaling.number("factor")?, scaling.number("mscale_all_dim")?.filter(|m| *m != 0.0)) {
        (Some(factor), Some(all_dim)) => RopeScaling::yarn_mscale(factor, all_dim),
        _ => 1.0,
    };
    Ok(latent.attention_scale(mscale))
}

/// The sparse MLP: in every layer but DeepSeek's first `first_k_dense_replace`; Qwen MoE configs
/// that make other layers dense are refused; None for a config without experts (a dense Granite 4).
fn moe(hf: &Keys, facts: &MoeFacts) -> Result<Option<MoeConfig>> {
    if hf.get("num_local_experts").and_then(Value::as_u64) == Some(0) {
        return Ok(None);
    }
    let sparse_every_layer = hf.get("decoder_sparse_step").is_none_or(|step| step.as_u64() == Some(1))
        && hf.get("moe_layer_freq").is_none_or(|every| every.as_u64() == Some(1))
        && !hf.flag("mlp_only_layers");
    if !sparse_every_layer {
        return Err(EngineError::UnsupportedModel(
            "this MoE model mixes dense and sparse layers (decoder_sparse_step / moe_layer_freq / mlp_only_layers); rsgl runs models whose every layer is sparse after the first dense ones.".into(),
        ));
    }
    let expert_intermediate_size = hf.count(facts.expert_ffn_key)?;
    let scoring = match hf.get("scoring_func").and_then(Value::as_str) {
        None => facts.scoring,
        Some("softmax") => ExpertScoring::Softmax,
        Some("sigmoid") => ExpertScoring::Sigmoid,
        Some(other) => {
            return Err(EngineError::UnsupportedModel(format!("this model scores experts with {other:?}; rsgl runs 'softmax' and 'sigmoid' routers.")))
        }
    };
    Ok(Some(MoeConfig {
        // transformers 5 saves Qwen3-MoE's expert count as num_local_experts, Qwen2-MoE's as
        // num_experts; DeepSeek's is n_routed_experts.
        num_experts: hf.first_count(&["num_local_experts", "num_experts", "n_routed_experts"])?,
        experts_per_token: hf.count("num_experts_per_tok")?,
        expert_intermediate_size,
        norm_topk_prob: facts.renormalizes_top_k || hf.flag("norm_topk_prob"),
        shared_expert_intermediate_size: match hf.optional_count("n_shared_experts")? {
            Some(shared) => Some(shared * expert_intermediate_size).filter(|&size| size > 0),
            None => hf.optional_count(facts.shared_expert_ffn_key)?,
        },
        scoring,
        expert_groups: expert_groups(hf, scoring)?,
        routed_scaling_factor: hf.number("routed_scaling_factor")?.unwrap_or(1.0) as f32,
        dense_layers: hf.optional_count("first_k_dense_replace")?.unwrap_or(0),
    }))
}

/// DeepSeek's group-limited routing over `n_group` groups: a softmax router's where its
/// `topk_method` is `group_limited_greedy` (each group ranked by its best expert), a sigmoid
/// router's always (ranked by its best two).
fn expert_groups(hf: &Keys, scoring: ExpertScoring) -> Result<Option<ExpertGroups>> {
    let groups = hf.optional_count("n_group")?.unwrap_or(1);
    let score = match scoring {
        ExpertScoring::Softmax if hf.get("topk_method").and_then(Value::as_str) == Some("group_limited_greedy") => GroupScore::Best,
        ExpertScoring::Softmax => return Ok(None),
        ExpertScoring::Sigmoid => GroupScore::BestTwo,
    };
    if groups <= 1 {
        return Ok(None);
    }
    Ok(Some(ExpertGroups { groups, groups_per_token: hf.count("topk_group")?, score }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ImageEncoder, VisionProjector};
    use serde_json::json;

    fn llama(extra: Value) -> Value {
        let mut raw = json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
            "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "vocab_size": 49152, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
            "max_position_embeddings": 8192, "tie_word_embeddings": true, "hidden_act": "silu",
        });
        raw.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        raw
    }

    fn message(raw: Value) -> String {
        ModelConfig::from_hf_config(&raw).unwrap_err().to_string()
    }

    #[test]
    fn normalizes_a_llama_config() {
        let cfg = ModelConfig::from_hf_config(llama(json!({}))).unwrap();
        assert_eq!((cfg.architecture.as_str(), cfg.head_dim, cfg.num_key_value_heads), ("llama", 64, 3));
        assert_eq!((cfg.rope_theta, cfg.rope_scaling.is_none(), cfg.tie_word_embeddings), (1e5, true, true));
        let from_text = ModelConfig::from_hf_config(&mut serde_json::Deserializer::from_str(&llama(json!({})).to_string())).unwrap();
        assert_eq!(from_text.max_position_embeddings, 8192);
    }

    #[test]
    fn reads_llama3_rope_scaling_from_either_layout() {
        let scaling = json!({ "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192 });
        let mut v5_parameters = json!({ "rope_type": "llama3", "rope_theta": 5e5 });
        v5_parameters.as_object_mut().unwrap().extend(scaling.as_object().unwrap().clone());
        let mut v4_scaling = json!({ "type": "llama3" });
        v4_scaling.as_object_mut().unwrap().extend(scaling.as_object().unwrap().clone());
        for raw in [llama(json!({ "rope_theta": 5e5, "rope_scaling": v4_scaling })), llama(json!({ "rope_theta": null, "rope_parameters": v5_parameters }))] {
            let cfg = ModelConfig::from_hf_config(&raw).unwrap();
            assert_eq!(cfg.rope_theta, 5e5);
            let Some(RopeScaling::Llama3 { factor, original_max_position_embeddings, .. }) = cfg.rope_scaling else { panic!("no llama3 scaling") };
            assert_eq!((factor, original_max_position_embeddings), (8.0, 8192.0));
        }
        assert!(message(llama(json!({ "rope_scaling": { "rope_type": "dynamic" } }))).contains("'dynamic' RoPE scaling"));
        assert!(
            message(llama(json!({ "rope_scaling": { "rope_type": "llama3", "factor": 8.0 } }))).contains("lacks low_freq_factor, high_freq_factor, original")
        );
    }

    /// Gemma 3 4B's config.json as on the Hub: the language model's keys that differ from
    /// Gemma3TextConfig's, inside the vision-language model's.
    #[test]
    fn reads_the_language_model_of_a_vision_language_config() {
        let raw = json!({
            "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "mm_tokens_per_image": 256,
            "text_config": { "hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text", "num_hidden_layers": 34,
                             "rope_scaling": { "factor": 8.0, "rope_type": "linear" }, "sliding_window": 1024 },
            "vision_config": { "hidden_size": 1152, "image_size": 896, "intermediate_size": 4304, "model_type": "siglip_vision_model",
                               "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14, "vision_use_head": false },
            "image_token_index": 262144, "boi_token_index": 255999, "eoi_token_index": 256000,
        });
        let cfg = ModelConfig::from_hf_config(&raw).unwrap();
        let Some(ImageEncoder::Siglip(vision)) = cfg.vision.as_ref() else { panic!("Gemma 3's tower is SigLIP's") };
        // 64 x 64 patches pooled in squares of 4 into 256 tokens, attended both ways.
        assert_eq!((vision.projector, vision.scale_factor, vision.tokens_per_tile(), vision.image_token_id), (VisionProjector::AveragePool, 4, 256, 262144));
        assert_eq!((vision.layer_norm_eps, vision.bidirectional_image_tokens), (1e-6, true));
        let mut not_square = raw.clone();
        not_square["mm_tokens_per_image"] = json!(200);
        assert!(message(not_square).contains("mm_tokens_per_image 200 is not a square"));
        assert_eq!((cfg.architecture.as_str(), cfg.hidden_size, cfg.num_hidden_layers, cfg.head_dim, cfg.vocab_size), ("gemma3_text", 2560, 34, 256, 262208));
        assert_eq!((cfg.scales.attention, cfg.tie_word_embeddings, cfg.rope_theta), (Some(1.0 / 16.0), true, 1e6));
        let window = cfg.sliding_window.unwrap();
        assert_eq!((window.size, window.layers.len(), window.rope_theta), (1024, 29, Some(1e4)));
        let unknown = json!({ "architectures": ["LlavaForConditionalGeneration"], "text_config": { "model_type": "vicuna" } });
        assert!(message(unknown).contains("this model's language model ('vicuna')"));
    }

    /// Ministral 3's config.json (transformers 5 layout, and as transformers 4 would write it):
    /// YaRN and the query temperature over the original context.
    #[test]
    fn reads_yarn_and_query_temperature_from_either_layout() {
        let scaling = json!({
            "factor": 16.0, "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0,
            "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1,
        });
        let mut v5_parameters = json!({ "rope_type": "yarn", "rope_theta": 1e6 });
        v5_parameters.as_object_mut().unwrap().extend(scaling.as_object().unwrap().clone());
        let mut v4_scaling = json!({ "type": "yarn" });
        v4_scaling.as_object_mut().unwrap().extend(scaling.as_object().unwrap().clone());
        let ministral3 = |extra: Value| {
            let mut raw = llama(json!({ "architectures": ["Ministral3ForCausalLM"], "max_position_embeddings": 262144 }));
            raw.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            raw
        };
        let v5 = ministral3(json!({ "rope_theta": null, "rope_parameters": v5_parameters }));
        for raw in [v5, ministral3(json!({ "rope_theta": 1e6, "rope_scaling": v4_scaling }))] {
            let cfg = ModelConfig::from_hf_config(&raw).unwrap();
            let Some(RopeScaling::Yarn { factor, original_max_position_embeddings: original, beta_fast, beta_slow, truncate, attention_factor }) =
                cfg.rope_scaling
            else {
                panic!("no YaRN")
            };
            assert_eq!((cfg.architecture.as_str(), cfg.rope_theta), ("ministral3", 1e6));
            assert_eq!((factor, original, beta_fast, beta_slow, truncate, attention_factor), (16.0, 16384, 32.0, 1.0, true, 1.0));
            assert_eq!(cfg.scales.query_temperature, Some(QueryTemperature { beta: 0.1, length: 16384 }));
        }
        // gpt-oss: no mscales (the attention factor 1 + 0.1 ln 32), an exact blend.
        let gpt_oss = llama(json!({ "rope_scaling": { "rope_type": "yarn", "factor": 32.0, "original_max_position_embeddings": 4096, "truncate": false } }));
        let cfg = ModelConfig::from_hf_config(&gpt_oss).unwrap();
        let Some(RopeScaling::Yarn { truncate, attention_factor, .. }) = cfg.rope_scaling else { panic!("no YaRN") };
        assert_eq!((truncate, attention_factor, cfg.scales.query_temperature), (false, 1.0 + 0.1 * 32f64.ln(), None));
    }

    /// transformers 5 lists each layer's kind and keys rope parameters by it; transformers 4
    /// (the files on the Hub) gives a pattern and `rope_local_base_freq`; both say the same.
    #[test]
    fn reads_gemma3_local_layers_from_either_layout() {
        let gemma3 = |extra: Value| {
            let mut raw = llama(json!({
                "architectures": ["Gemma3ForCausalLM"], "hidden_activation": "gelu_pytorch_tanh", "hidden_act": null,
                "num_hidden_layers": 7, "hidden_size": 64, "head_dim": 32, "query_pre_attn_scalar": 16, "sliding_window": 512,
            }));
            raw.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            ModelConfig::from_hf_config(&raw).unwrap()
        };
        let kinds: Vec<&str> = (0..7).map(|layer| if layer % 6 == 5 { "full_attention" } else { "sliding_attention" }).collect();
        let v5 = gemma3(json!({ "layer_types": kinds, "rope_theta": null, "rope_parameters": {
            "full_attention": { "rope_type": "linear", "factor": 8.0, "rope_theta": 1e6 },
            "sliding_attention": { "rope_type": "default", "rope_theta": 1e4 },
        }}));
        let v4 = gemma3(
            json!({ "sliding_window_pattern": 6, "rope_theta": 1e6, "rope_local_base_freq": 1e4, "rope_scaling": { "rope_type": "linear", "factor": 8.0 } }),
        );
        for cfg in [&v5, &v4] {
            assert_eq!(cfg.sliding_window, Some(SlidingWindow { size: 512, layers: vec![0, 1, 2, 3, 4, 6], rope_theta: Some(1e4) }));
            assert!(matches!(cfg.rope_scaling, Some(RopeScaling::Linear { factor: 8.0 })) && cfg.rope_theta == 1e6);
            assert_eq!((cfg.activation, cfg.norm_weight_offset, cfg.scales.embedding, cfg.scales.attention), (Activation::GeluTanh, 1.0, 8.0, Some(0.25)));
        }
        assert!(message(llama(json!({ "hidden_act": "relu2" }))).contains("the 'relu2' activation; rsgl runs 'silu' and 'gelu_pytorch_tanh' models"));
    }

    /// Phi-4-mini's config.json (transformers 4 layout): LongRoPE over 3/4 of each head.
    #[test]
    fn reads_phi3_longrope_and_partial_rotary() {
        let factors: Vec<f64> = (0..48).map(|i| 1.0 + i as f64).collect();
        let raw = llama(json!({
            "architectures": ["Phi3ForCausalLM"], "hidden_size": 3072, "num_attention_heads": 24, "partial_rotary_factor": 0.75,
            "max_position_embeddings": 131072, "original_max_position_embeddings": 4096,
            "rope_scaling": { "type": "longrope", "short_factor": factors, "long_factor": factors },
        }));
        let cfg = ModelConfig::from_hf_config(&raw).unwrap();
        assert_eq!((cfg.head_dim, cfg.rotary_dim), (128, Some(96)));
        let Some(RopeScaling::LongRope { original_max_position_embeddings, attention_factor, .. }) = cfg.rope_scaling else { panic!("no LongRoPE") };
        assert_eq!(original_max_position_embeddings, 4096);
        assert!((attention_factor - (1.0 + 32f64.ln() / 4096f64.ln()).sqrt()).abs() < 1e-12);
        let mut short = raw.clone();
        short["rope_scaling"]["short_factor"] = json!([1.0]);
        assert!(message(short).contains("LongRoPE needs 48 short and long factors (one per rotary frequency); it has 1 and 48"));
    }

    #[test]
    fn caps_the_context_at_a_sliding_window_that_applies() {
        let context = |raw: Value| ModelConfig::from_hf_config(&raw).unwrap().max_position_embeddings;
        assert_eq!(context(llama(json!({ "architectures": ["MistralForCausalLM"], "sliding_window": 4096 }))), 4096);
        assert_eq!(context(llama(json!({ "architectures": ["MistralForCausalLM"], "sliding_window": null }))), 8192);
        assert_eq!(context(llama(json!({ "architectures": ["Qwen2ForCausalLM"], "sliding_window": 16, "use_sliding_window": false }))), 8192);
        assert_eq!(context(llama(json!({ "architectures": ["Qwen2ForCausalLM"], "sliding_window": 16, "use_sliding_window": true }))), 16);
    }

    #[test]
    fn normalizes_moe_configs() {
        let mixtral = ModelConfig::from_hf_config(llama(json!({ "architectures": ["MixtralForCausalLM"], "num_local_experts": 8, "num_experts_per_tok": 2 })));
        let moe = mixtral.unwrap().moe.unwrap();
        assert_eq!((moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size, moe.norm_topk_prob), (8, 2, 1536, true));
        let qwen = llama(json!({
            "architectures": ["Qwen2MoeForCausalLM"], "num_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40,
        }));
        let cfg = ModelConfig::from_hf_config(&qwen).unwrap();
        let moe = cfg.moe.as_ref().unwrap();
        assert!(cfg.attention_bias && !moe.norm_topk_prob);
        assert_eq!((moe.expert_intermediate_size, moe.shared_expert_intermediate_size), (24, Some(40)));
        let mut mixed = qwen;
        mixed["mlp_only_layers"] = json!([0]);
        assert!(message(mixed).contains("dense and sparse"));
    }

    /// Granite 4.0-H as the Hub has it (transformers 4 layout: `layers_block_type`, `mamba_d_head` "auto"):
    /// Mamba-2 layers beside attention without rope; with experts, or the shared MLP alone.
    #[test]
    fn normalizes_granite_hybrid_configs() {
        let granite = |extra: Value| {
            let mut raw = llama(json!({
                "architectures": ["GraniteMoeHybridForCausalLM"], "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
                "intermediate_size": 32, "shared_intermediate_size": 48, "num_local_experts": 4, "num_experts_per_tok": 2,
                "layers_block_type": ["mamba", "attention", "mamba", "mamba"], "mamba_n_heads": 8, "mamba_d_head": "auto",
                "mamba_n_groups": 2, "mamba_d_state": 16, "position_embedding_type": "nope",
            }));
            raw.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            raw
        };
        let cfg = ModelConfig::from_hf_config(granite(json!({}))).unwrap();
        let mamba = cfg.mamba2.clone().unwrap();
        assert_eq!(mamba, Mamba2 { layers: vec![0, 2, 3], heads: 8, head_dim: 16, state_size: 16, groups: 2, conv_kernel: 4 });
        assert_eq!((cfg.intermediate_size, cfg.no_rope_layers.len(), cfg.attention_layers(), cfg.gated_delta_net.is_none()), (48, 4, 1, true));
        let moe = cfg.moe.unwrap();
        assert_eq!((moe.expert_intermediate_size, moe.shared_expert_intermediate_size, moe.norm_topk_prob), (32, Some(48), true));
        let dense = ModelConfig::from_hf_config(granite(json!({ "num_local_experts": 0, "position_embedding_type": "rope" }))).unwrap();
        assert!(dense.moe.is_none() && dense.no_rope_layers.is_empty());
        // transformers 5 writes the layer kinds' new names and infinity as an object.
        let v5 = granite(json!({ "layers_block_type": null, "layer_types": ["linear_attention", "full_attention", "linear_attention", "linear_attention"],
                                  "time_step_limit": [0.0, { "__float__": "Infinity" }] }));
        assert_eq!(ModelConfig::from_hf_config(v5).unwrap().mamba2.unwrap().layers, vec![0, 2, 3]);
        assert!(message(granite(json!({ "time_step_limit": [0.0, 10.0] }))).contains("bounds its Mamba-2 step sizes"));
    }

    #[test]
    fn normalizes_a_gpt_oss_config() {
        let gpt_oss = llama(json!({
            "architectures": ["GptOssForCausalLM"], "num_local_experts": 4, "num_experts_per_tok": 2, "intermediate_size": 96,
            "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"], "num_hidden_layers": 2,
            "swiglu_limit": 7.0, "swiglu_alpha": 1.702,
        }));
        let cfg = ModelConfig::from_hf_config(&gpt_oss).unwrap();
        let moe = cfg.moe.as_ref().unwrap();
        // hidden_act says "silu", but its experts' SwiGLU is the clamped one.
        assert_eq!((cfg.architecture.as_str(), cfg.activation, cfg.attention_bias), ("gpt_oss", Activation::ClampedSwiglu, true));
        assert_eq!((moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size, moe.norm_topk_prob), (4, 2, 96, true));
        assert_eq!(cfg.sliding_window, Some(SlidingWindow { size: 8, layers: vec![0], rope_theta: None }));
        let mut other_limit = gpt_oss;
        other_limit["swiglu_limit"] = json!(10.0);
        assert!(message(other_limit).contains("SwiGLU limit"));
    }

    #[test]
    fn refuses_what_the_runner_does_not_implement_and_broken_configs() {
        let refusal = |raw: Value| ModelConfig::from_hf_config(&raw).unwrap_err();
        assert!(
            matches!(refusal(llama(json!({ "architectures": ["GPT2LMHeadModel"] }))), EngineError::UnsupportedModel(m) if m.contains("'GPT2LMHeadModel' architecture; it runs LlamaForCausalLM"))
        );
        assert!(matches!(refusal(llama(json!({ "hidden_act": "gelu" }))), EngineError::UnsupportedModel(m) if m.contains("'gelu' activation")));
        assert!(matches!(refusal(llama(json!({ "mlp_bias": true }))), EngineError::UnsupportedModel(_)));
        assert!(matches!(refusal(llama(json!({ "vocab_size": null }))), EngineError::ModelLoad(m) if m.starts_with("config.json has no 'vocab_size'")));
        assert!(matches!(refusal(llama(json!({ "hidden_size": "576" }))), EngineError::ModelLoad(m) if m.contains("not a whole number")));
        assert!(matches!(refusal(json!([1])), EngineError::ModelLoad(m) if m.contains("no JSON object")));
    }
}
