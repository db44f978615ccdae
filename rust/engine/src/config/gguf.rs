//! A GGUF file's metadata (llama.cpp's keys) mapped onto the normalized config, with the facts
//! the metadata leaves to its tensors.

use super::architecture::{Architecture, MoeFacts};
use super::keys::{quoted, truthy, Keys};
use super::vision;
use super::{
    ExpertGroups, ExpertScoring, GatedDeltaNet, GroupScore, LatentAttention, ModelConfig, MoeConfig, QueryTemperature, RopeScaling, Scales, SlidingWindow,
    ValueHeadOrder,
};
use crate::error::{EngineError, Result};
use crate::model::archs::QkNorm;
use crate::pooling::Pooling;
use crate::weights::WeightStore;
use std::path::Path;

impl ModelConfig {
    /// The normalized config of a GGUF file, from its metadata and from its tensors (mapped
    /// here under Hugging Face names) where the metadata leaves facts to them; with llama.cpp's
    /// separate projector file (`projector`), its vision config too.
    pub fn from_gguf(path: &Path, projector: Option<&Path>) -> Result<ModelConfig> {
        let metadata = WeightStore::gguf_metadata(path)?;
        let source = path.display();
        let general = Keys::new(&metadata, format!("{source}'s metadata"), "the file looks broken: download it again");
        if metadata.get("general.type").and_then(serde_json::Value::as_str) == Some("adapter") {
            return Err(EngineError::ModelLoad(format!(
                "{source} is an adapter (general.type \"adapter\"), not a model: serve its base model with it as a LoRA adapter (lora_paths, --lora-paths NAME=PATH)"
            )));
        }
        let gguf_name = general.required("general.architecture")?;
        let unsupported = || {
            EngineError::UnsupportedModel(format!(
                "{source} holds a {} model; rsgl runs {} GGUF files.",
                quoted(gguf_name),
                Architecture::list(|a| a.gguf_name)
            ))
        };
        let prefix = gguf_name.as_str().ok_or_else(unsupported)?;
        let keys = general.prefixed(format!("{prefix}."));
        let architecture = Architecture::of_gguf(prefix, keys.flag("expert_count")).ok_or_else(unsupported)?;
        let rope_scaling = match keys.get("rope.scaling.type").filter(|kind| *kind != "none") {
            None => None,
            Some(kind) if kind == "linear" => Some(RopeScaling::Linear { factor: keys.required_number("rope.scaling.factor")? }),
            Some(kind) if kind == "yarn" => Some(yarn(&keys, architecture)?),
            Some(kind) => {
                return Err(EngineError::UnsupportedModel(format!("{source} uses {} RoPE scaling, which rsgl does not support yet in GGUF.", quoted(kind))))
            }
        };
        let heads = keys.count("attention.head_count")?;
        let kv_heads = keys.optional_count("attention.head_count_kv")?.unwrap_or(heads);
        let store = WeightStore::open_gguf(path, architecture.name, heads, kv_heads)?;
        let rope_scaling = match rope_scaling {
            None if store.contains("rope_factors_long.weight") => Some(longrope(&keys, &store)?),
            given => given,
        };
        if store.contains("rope_freqs.weight") {
            return Err(EngineError::UnsupportedModel(format!(
                "{source} bakes llama3 RoPE scaling into a rope_freqs tensor, which rsgl does not read yet; load the model's Hugging Face folder instead."
            )));
        }
        let vocab_size = match keys.optional_count("vocab_size")? {
            Some(vocab) => vocab,
            None => store.shape("model.embed_tokens.weight").and_then(|shape| shape.first().copied()).ok_or_else(|| {
                EngineError::ModelLoad(format!("{source} has no token embedding (token_embd.weight); the file looks broken: download it again."))
            })?,
        };
        let hidden_size = keys.count("embedding_length")?;
        // Qwen3.5's and Qwen3-Next's converter counts the multi-token prediction layers it appends
        // (which rsgl does not read yet) in `block_count`.
        let num_hidden_layers = keys.count("block_count")?.saturating_sub(keys.optional_count("nextn_predict_layers")?.unwrap_or(0));
        let head_dim = keys.optional_count("attention.key_length")?.unwrap_or(hidden_size.checked_div(heads).unwrap_or(0));
        let latent_attention = latent_attention(&keys)?;
        let mut scales = scales(&keys, architecture, [hidden_size, heads, head_dim, num_hidden_layers])?;
        let mut rope_scaling = rope_scaling;
        // Latent pages hold one kv head: the latent and the rope key (see `ModelConfig::latent_attention`).
        let (kv_heads, head_dim, rotary_dim) = match &latent_attention {
            Some(latent) => {
                scales.attention = Some(latent_attention_scale(&keys, latent, rope_scaling.as_mut())?);
                (1, latent.latent_key_dim(), Some(latent.qk_rope_head_dim))
            }
            None => (kv_heads, head_dim, keys.optional_count("rope.dimension_count")?.filter(|&dim| dim != head_dim)),
        };
        let config = ModelConfig {
            architecture: architecture.name.into(),
            hidden_size,
            intermediate_size: keys.first_count(&["feed_forward_length", "expert_feed_forward_length"])?,
            num_hidden_layers,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            // Zero heads: validate() says so.
            head_dim,
            vocab_size,
            rms_norm_eps: keys.required_number("attention.layer_norm_rms_epsilon")? as f32,
            rope_theta: keys.number("rope.freq_base")?.unwrap_or(10000.0),
            rope_scaling,
            rotary_dim,
            attention_bias: store.contains("model.layers.0.self_attn.q_proj.bias"),
            // A family that normalizes q and k may leave it to the config (GLM-4.5's
            // `use_qk_norm`), which the file then says by having the norms or not.
            qk_norm: architecture.assembly.qk_norm != QkNorm::None && store.remaining_names().iter().any(|name| name.ends_with("self_attn.q_norm.weight")),
            tie_word_embeddings: !store.contains("lm_head.weight"),
            max_position_embeddings: keys.count("context_length")?,
            moe: architecture.moe.as_ref().map(|facts| moe(&keys, facts)).transpose()?,
            pooling: keys.optional_count("pooling_type")?.and_then(Pooling::from_gguf),
            scales,
            no_rope_layers: no_rope_layers(architecture, num_hidden_layers),
            sliding_window: sliding_window(&keys, architecture, num_hidden_layers)?,
            activation: architecture.assembly.activation,
            // llama.cpp's converter stores Gemma's, Qwen3.5's and Qwen3-Next's norm weights as the
            // `1 + w` they scale by.
            norm_weight_offset: 0.0,
            gated_delta_net: gated_delta_net(&keys, architecture, num_hidden_layers)?,
            mamba2: None,
            latent_attention,
            vision: projector
                .map(|projector| vision::projector_config(&WeightStore::gguf_metadata(projector)?, &projector.display().to_string(), &metadata, hidden_size))
                .transpose()?,
        };
        config.validate()?;
        Ok(config)
    }
}

/// Phi-3's LongRoPE: the factors are tensors (`rope_factors_short`, `rope_factors_long`), the
/// original context and the attention factor keys.
fn longrope(keys: &Keys, store: &WeightStore) -> Result<RopeScaling> {
    let factors = |name: &str| -> Result<Vec<f64>> { Ok(store.read(name)?.into_iter().map(f64::from).collect()) };
    Ok(RopeScaling::LongRope {
        short_factor: factors("rope_factors_short.weight")?,
        long_factor: factors("rope_factors_long.weight")?,
        original_max_position_embeddings: keys.count("rope.scaling.original_context_length")?,
        attention_factor: keys.number("rope.scaling.attn_factor")?.unwrap_or(1.0),
    })
}

/// YaRN as llama.cpp's converter writes it. The attention factor is transformers' own where
/// the file has it (`yarn_attn_factor`), else derived taking `yarn_log_multiplier` for
/// `mscale_all_dim` and `mscale` to be 1, as llama.cpp does for Ministral 3 (DeepSeek files
/// store 0.1 × mscale_all_dim there). The blend's bounds are rounded as transformers rounds
/// them for the family (ggml always rounds them out).
fn yarn(keys: &Keys, architecture: &Architecture) -> Result<RopeScaling> {
    let factor = keys.required_number("rope.scaling.factor")?;
    let attention_factor = match keys.number("rope.scaling.yarn_attn_factor")? {
        Some(given) => given,
        None => RopeScaling::yarn_attention_factor(factor, Some(1.0), keys.number("rope.scaling.yarn_log_multiplier")?),
    };
    Ok(RopeScaling::Yarn {
        factor,
        original_max_position_embeddings: keys.count("rope.scaling.original_context_length")?,
        beta_fast: keys.number("rope.scaling.yarn_beta_fast")?.unwrap_or(32.0),
        beta_slow: keys.number("rope.scaling.yarn_beta_slow")?.unwrap_or(1.0),
        truncate: architecture.yarn_truncates,
        attention_factor,
    })
}

/// Granite's multipliers, which its converter writes only where the config sets them (else they
/// are neutral), Ministral 3's query temperature (over `attention.temperature_length`, else the
/// original context, which its files give), and Gemma's embedding scale and soft caps. GGUF
/// files keep no `query_pre_attn_scalar`: llama.cpp takes it to be `head_dim` except in the 27B
/// Gemmas (46 or 62 layers), where it is `hidden_size / heads`, as their configs say.
fn scales(keys: &Keys, architecture: &Architecture, [hidden, heads, head_dim, layers]: [usize; 4]) -> Result<Scales> {
    let optional = |key: &str| -> Result<Option<f32>> { Ok(keys.number(key)?.map(|value| value as f32)) };
    if !architecture.assembly.embedding_times_sqrt_hidden {
        let one = |key: &str| -> Result<f32> { Ok(keys.number(key)?.unwrap_or(1.0) as f32) };
        let query_temperature = match optional("attention.temperature_scale")?.filter(|&beta| beta != 0.0) {
            Some(beta) => Some(QueryTemperature { beta, length: keys.first_count(&["attention.temperature_length", "rope.scaling.original_context_length"])? }),
            None => None,
        };
        return Ok(Scales {
            embedding: one("embedding_scale")?,
            residual: one("residual_scale")?,
            // llama.cpp reads 0 as unset: 1/sqrt(head_dim).
            attention: optional("attention.scale")?.filter(|&scale| scale != 0.0),
            // Granite's `logits_scaling`, the logits' divisor in llama.cpp as in transformers (of
            // the architectures rsgl runs, only Granite's converter writes the key).
            logits_divisor: one("logit_scale")?,
            query_temperature,
            ..Scales::default()
        });
    }
    let query_pre_attn_scalar = if matches!(layers, 46 | 62) { hidden / heads.max(1) } else { head_dim };
    Ok(Scales {
        embedding: (hidden as f32).sqrt(),
        attention: Some(1.0 / (query_pre_attn_scalar as f32).sqrt()),
        attention_logit_cap: optional("attn_logit_softcapping")?,
        final_logit_cap: optional("final_logit_softcapping")?,
        ..Scales::default()
    })
}

/// SmolLM3's NoPE layers, which GGUF files do not list: each `n`th, as llama.cpp assumes.
fn no_rope_layers(architecture: &Architecture, layers: usize) -> Vec<usize> {
    architecture.no_rope_layer_every.map_or_else(Vec::new, |every| (0..layers).filter(|layer| (layer + 1) % every == 0).collect())
}

/// Gemma's sliding layers: `attention.sliding_window_pattern` (a flag per layer, or every how
/// many layers one is global) where the file has it, else the family's pattern as llama.cpp
/// assumes it; the local rope base is `rope.freq_base_swa`, else the family's.
fn sliding_window(keys: &Keys, architecture: &Architecture, layers: usize) -> Result<Option<SlidingWindow>> {
    let (Some(every), Some(size)) = (architecture.global_layer_every, keys.optional_count("attention.sliding_window")?) else { return Ok(None) };
    let sliding: Vec<usize> = match keys.get("attention.sliding_window_pattern") {
        Some(serde_json::Value::Array(flags)) => (0..layers).filter(|&layer| flags.get(layer).is_some_and(truthy)).collect(),
        _ => {
            let every = keys.optional_count("attention.sliding_window_pattern")?.unwrap_or(every);
            SlidingWindow::all_but_every(every, layers)
        }
    };
    let rope_theta = keys.number("rope.freq_base_swa")?.or(architecture.local_rope_theta);
    Ok((!sliding.is_empty()).then_some(SlidingWindow { size, layers: sliding, rope_theta }))
}

/// Qwen3-Next's and Qwen3.5's Gated DeltaNet layers: those `attention.recurrent_layers` flags,
/// else all but every `full_attention_interval`th; llama.cpp's `ssm` keys give their shape (its
/// groups are the key heads, its time-step rank the value heads).
fn gated_delta_net(keys: &Keys, architecture: &Architecture, layers: usize) -> Result<Option<GatedDeltaNet>> {
    let linear: Vec<usize> = match (keys.get("attention.recurrent_layers"), keys.optional_count("full_attention_interval")?) {
        (Some(serde_json::Value::Array(flags)), _) => (0..layers).filter(|&layer| flags.get(layer).is_some_and(truthy)).collect(),
        (_, Some(every)) => SlidingWindow::all_but_every(every, layers),
        _ => Vec::new(),
    };
    if linear.is_empty() {
        return Ok(None);
    }
    let value_heads = keys.count("ssm.time_step_rank")?;
    Ok(Some(GatedDeltaNet {
        layers: linear,
        key_heads: keys.count("ssm.group_count")?,
        value_heads,
        key_head_dim: keys.count("ssm.state_size")?,
        // Zero value heads: validate() says so.
        value_head_dim: keys.count("ssm.inner_size")?.checked_div(value_heads).unwrap_or(0),
        conv_kernel: keys.count("ssm.conv_kernel")?,
        value_head_order: if architecture.gguf_tiles_value_heads { ValueHeadOrder::Tiled } else { ValueHeadOrder::Grouped },
    }))
}

/// Multi-head latent attention, where the file has a `attention.kv_lora_rank` (llama.cpp's
/// deepseek2): q's and v's head widths are the `_mla` key and value lengths.
fn latent_attention(keys: &Keys) -> Result<Option<LatentAttention>> {
    let Some(kv_lora_rank) = keys.optional_count("attention.kv_lora_rank")? else { return Ok(None) };
    let qk_rope_head_dim = keys.count("rope.dimension_count")?;
    Ok(Some(LatentAttention {
        q_lora_rank: keys.optional_count("attention.q_lora_rank")?.filter(|&rank| rank > 0),
        kv_lora_rank,
        qk_nope_head_dim: keys.count("attention.key_length_mla")?.saturating_sub(qk_rope_head_dim),
        qk_rope_head_dim,
        v_head_dim: keys.count("attention.value_length_mla")?,
    }))
}

/// DeepSeek's attention scale, as llama.cpp computes it from a file: 1/sqrt(q's head width) times
/// YaRN's `1 + yarn_log_multiplier ln(factor)` squared (the converter stores 0.1 × mscale_all_dim
/// as the multiplier). llama.cpp leaves cos and sin unscaled (DeepSeek's `mscale` equals its
/// `mscale_all_dim`), so the rope's attention factor becomes 1.
fn latent_attention_scale(keys: &Keys, latent: &LatentAttention, rope_scaling: Option<&mut RopeScaling>) -> Result<f32> {
    let Some(RopeScaling::Yarn { factor, attention_factor, .. }) = rope_scaling else { return Ok(latent.attention_scale(1.0)) };
    *attention_factor = 1.0;
    let mscale = 1.0 + keys.number("rope.scaling.yarn_log_multiplier")?.unwrap_or(0.0) * factor.ln();
    Ok(latent.attention_scale(mscale))
}

fn moe(keys: &Keys, facts: &MoeFacts) -> Result<MoeConfig> {
    let expert_intermediate_size = keys.first_count(&["expert_feed_forward_length", "feed_forward_length"])?;
    // llama.cpp's `expert_gating_func`: 1 softmax, 2 sigmoid.
    let scoring = match keys.optional_count("expert_gating_func")? {
        None => facts.scoring,
        Some(1) => ExpertScoring::Softmax,
        Some(2) => ExpertScoring::Sigmoid,
        Some(other) => {
            return Err(EngineError::UnsupportedModel(format!(
                "this file's experts are gated by llama.cpp's function {other}; rsgl runs softmax (1) and sigmoid (2) gating."
            )))
        }
    };
    let groups = keys.optional_count("expert_group_count")?.unwrap_or(1);
    let expert_groups = match groups {
        0 | 1 => None,
        groups => Some(ExpertGroups {
            groups,
            groups_per_token: keys.count("expert_group_used_count")?,
            score: if scoring == ExpertScoring::Sigmoid { GroupScore::BestTwo } else { GroupScore::Best },
        }),
    };
    Ok(MoeConfig {
        num_experts: keys.count("expert_count")?,
        experts_per_token: keys.count("expert_used_count")?,
        expert_intermediate_size,
        norm_topk_prob: keys.get("expert_weights_norm").map_or(facts.gguf_renormalizes_top_k, truthy),
        // DeepSeek's files count their shared experts, each of the experts' size.
        shared_expert_intermediate_size: match keys.optional_count("expert_shared_count")? {
            Some(shared) if shared > 0 => Some(shared * expert_intermediate_size),
            _ => keys.optional_count("expert_shared_feed_forward_length")?,
        },
        scoring,
        expert_groups,
        routed_scaling_factor: keys.number("expert_weights_scale")?.filter(|&scale| scale != 0.0).unwrap_or(1.0) as f32,
        dense_layers: keys.optional_count("leading_dense_block_count")?.unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::weights::tests::{gguf_with_metadata, TempFile};
    use serde_json::json;

    /// gpt-oss-20b's metadata as llama.cpp's converter writes it (4 layers), and the tensors the
    /// config reads: what the file leaves unsaid (the unrounded YaRN blend, which layers slide,
    /// the renormalized top-k) comes from the architecture, as transformers has it.
    #[test]
    fn a_gpt_oss_gguf_file_reads_as_its_hugging_face_config() {
        let metadata = json!({
            "general.architecture": "gpt-oss", "gpt-oss.block_count": 4, "gpt-oss.context_length": 131072,
            "gpt-oss.embedding_length": 32, "gpt-oss.feed_forward_length": 2880, "gpt-oss.attention.head_count": 64,
            "gpt-oss.attention.head_count_kv": 8, "gpt-oss.rope.scaling.type": "yarn", "gpt-oss.rope.scaling.factor": 32.0,
            "gpt-oss.rope.scaling.original_context_length": 4096, "gpt-oss.rope.scaling.yarn_beta_fast": 32.0,
            "gpt-oss.rope.scaling.yarn_beta_slow": 1.0, "gpt-oss.rope.freq_base": 150000.0,
            "gpt-oss.attention.layer_norm_rms_epsilon": 1e-5, "gpt-oss.expert_count": 32, "gpt-oss.expert_used_count": 4,
            "gpt-oss.attention.key_length": 64, "gpt-oss.attention.value_length": 64, "gpt-oss.attention.sliding_window": 128,
            "gpt-oss.expert_feed_forward_length": 2880,
        });
        let f32_tensor = |name, dims: Vec<u64>| (name, dims.clone(), 0, vec![0u8; 4 * dims.iter().product::<u64>() as usize]);
        let tensors = [f32_tensor("token_embd.weight", vec![32, 3]), f32_tensor("output.weight", vec![32, 3]), f32_tensor("blk.0.attn_q.bias", vec![4096])];
        let file = TempFile::new("gpt-oss-config.gguf", &gguf_with_metadata(metadata.as_object().unwrap(), &tensors));
        let cfg = ModelConfig::from_gguf(&file.0, None).unwrap();
        assert_eq!((cfg.architecture.as_str(), cfg.vocab_size, cfg.head_dim, cfg.attention_bias, cfg.tie_word_embeddings), ("gpt_oss", 3, 64, true, false));
        let Some(RopeScaling::Yarn { factor, original_max_position_embeddings, truncate, attention_factor, .. }) = cfg.rope_scaling else { panic!("no YaRN") };
        assert_eq!((factor, original_max_position_embeddings, truncate, attention_factor), (32.0, 4096, false, 1.0 + 0.1 * 32f64.ln()));
        let window = cfg.sliding_window.expect("a sliding window");
        assert_eq!((window.size, window.layers, window.rope_theta), (128, vec![0, 2], None));
        let moe = cfg.moe.expect("experts");
        assert_eq!((moe.num_experts, moe.experts_per_token, moe.expert_intermediate_size, moe.norm_topk_prob), (32, 4, 2880, true));
        assert_eq!(cfg.activation, crate::config::Activation::ClampedSwiglu);
    }

    #[test]
    fn a_lora_adapter_file_is_not_taken_for_a_model() {
        let metadata = json!({"general.architecture": "llama", "general.type": "adapter", "adapter.type": "lora", "adapter.lora.alpha": 16.0});
        let file = TempFile::new("adapter-as-model.gguf", &gguf_with_metadata(metadata.as_object().unwrap(), &[]));
        match ModelConfig::from_gguf(&file.0, None) {
            Err(EngineError::ModelLoad(message)) => assert!(message.contains("is an adapter") && message.contains("lora_paths"), "{message}"),
            other => panic!("not refused as an adapter: {other:?}"),
        }
    }
}
