//! A GGUF file's metadata (llama.cpp's keys) mapped onto the normalized config, with the facts
//! the metadata leaves to its tensors.

use super::architecture::{Architecture, MoeFacts};
use super::keys::{quoted, truthy, Keys};
use super::{ModelConfig, MoeConfig, Scales};
use crate::error::{EngineError, Result};
use crate::model::archs::QkNorm;
use crate::pooling::Pooling;
use crate::weights::WeightStore;
use std::path::Path;

impl ModelConfig {
    /// The normalized config of a GGUF file, from its metadata and from its tensors (mapped
    /// here under Hugging Face names) where the metadata leaves facts to them.
    pub fn from_gguf(path: &Path) -> Result<ModelConfig> {
        let metadata = WeightStore::gguf_metadata(path)?;
        let source = path.display();
        let general = Keys::new(&metadata, format!("{source}'s metadata"), "the file looks broken: download it again");
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
        if let Some(scaling) = keys.get("rope.scaling.type").filter(|kind| *kind != "none") {
            return Err(EngineError::UnsupportedModel(format!("{source} uses {} RoPE scaling, which rsgl does not support yet in GGUF.", quoted(scaling))));
        }
        let heads = keys.count("attention.head_count")?;
        let kv_heads = keys.optional_count("attention.head_count_kv")?.unwrap_or(heads);
        let store = WeightStore::open_gguf(path, architecture.name, heads, kv_heads)?;
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
        let config = ModelConfig {
            architecture: architecture.name.into(),
            hidden_size,
            intermediate_size: keys.first_count(&["feed_forward_length", "expert_feed_forward_length"])?,
            num_hidden_layers: keys.count("block_count")?,
            num_attention_heads: heads,
            num_key_value_heads: kv_heads,
            // Zero heads: validate() says so.
            head_dim: keys.optional_count("attention.key_length")?.unwrap_or(hidden_size.checked_div(heads).unwrap_or(0)),
            vocab_size,
            rms_norm_eps: keys.required_number("attention.layer_norm_rms_epsilon")? as f32,
            rope_theta: keys.number("rope.freq_base")?.unwrap_or(10000.0),
            rope_scaling: None,
            attention_bias: store.contains("model.layers.0.self_attn.q_proj.bias"),
            qk_norm: architecture.assembly.qk_norm != QkNorm::None,
            tie_word_embeddings: !store.contains("lm_head.weight"),
            max_position_embeddings: keys.count("context_length")?,
            moe: architecture.moe.as_ref().map(|facts| moe(&keys, facts)).transpose()?,
            pooling: keys.optional_count("pooling_type")?.and_then(Pooling::from_gguf),
            scales: Scales::default(),
            no_rope_layers: Vec::new(),
        };
        config.validate()?;
        Ok(config)
    }
}

fn moe(keys: &Keys, facts: &MoeFacts) -> Result<MoeConfig> {
    Ok(MoeConfig {
        num_experts: keys.count("expert_count")?,
        experts_per_token: keys.count("expert_used_count")?,
        expert_intermediate_size: keys.first_count(&["expert_feed_forward_length", "feed_forward_length"])?,
        norm_topk_prob: keys.get("expert_weights_norm").map_or(facts.gguf_renormalizes_top_k, truthy),
        shared_expert_intermediate_size: keys.optional_count("expert_shared_feed_forward_length")?,
    })
}
