//! A model directory for `rsgl-bench generate --model-dir`: a Hugging Face config.json and its
//! *.safetensors files, read without Python.
//!
//! config.json is mapped onto the engine's normalized config the way the Python loader does it
//! (python/rsgl/loader/hf.py); the weights are mapped by the engine's own reader.

use rsgl_engine::WeightStore;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Hugging Face model classes and the engine architecture each is.
const ARCHITECTURE_BY_CLASS: &[(&str, &str)] =
    &[("LlamaForCausalLM", "llama"), ("MistralForCausalLM", "mistral"), ("Qwen2ForCausalLM", "qwen2"), ("Qwen3ForCausalLM", "qwen3")];
const LLAMA3_ROPE_KEYS: &[&str] = &["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"];

pub struct ModelDir {
    /// The normalized config, as `ModelConfig::from_json` reads it.
    pub config: Value,
    pub weights: WeightStore,
    /// The tensor types the files hold, e.g. {"BF16"}.
    pub stored_dtypes: BTreeSet<String>,
}

pub fn load(dir: &Path) -> Result<ModelDir, String> {
    let config_path = dir.join("config.json");
    let text = std::fs::read_to_string(&config_path).map_err(|e| format!("cannot read {}: {e}", config_path.display()))?;
    let raw: Value = serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", config_path.display()))?;
    let mut config = normalize_config(&raw).map_err(|e| format!("{}: {e}", config_path.display()))?;

    let weights = WeightStore::open_safetensors(&safetensors_paths(dir)?).map_err(|e| e.to_string())?;
    // No lm_head: the output projection is the embedding (a saved one beside a tied embedding is
    // ignored by the model, as transformers ignores it).
    let tied = config["tie_word_embeddings"].as_bool().unwrap_or(false) || !weights.contains("lm_head.weight");
    config["tie_word_embeddings"] = json!(tied);
    let stored_dtypes = weights.names().iter().filter_map(|name| weights.stored(name)).map(|s| s.name().to_string()).collect();
    Ok(ModelDir { config, weights, stored_dtypes })
}

fn safetensors_paths(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read the model directory {}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> =
        entries.filter_map(|entry| entry.ok().map(|e| e.path())).filter(|path| path.extension().is_some_and(|ext| ext == "safetensors")).collect();
    if paths.is_empty() {
        return Err(format!("{} has no *.safetensors file", dir.display()));
    }
    paths.sort();
    Ok(paths)
}

// ---------------------------------------------------------------------------------------------
// config.json
// ---------------------------------------------------------------------------------------------

/// The engine's config from a transformers config.json (4.x or 5.x layout), as hf.py maps it.
fn normalize_config(raw: &Value) -> Result<Value, String> {
    let architecture = architecture(raw)?;
    if raw.get("hidden_act").and_then(Value::as_str).unwrap_or("silu") != "silu" {
        return Err(format!("activation {} is not supported; rsgl runs SiLU models", raw["hidden_act"]));
    }
    let hidden = required_usize(raw, "hidden_size")?;
    let heads = required_usize(raw, "num_attention_heads")?;
    let (rope_theta, rope_scaling) = rope(raw)?;
    Ok(json!({
        "architecture": architecture,
        "hidden_size": hidden,
        "intermediate_size": required_usize(raw, "intermediate_size")?,
        "num_hidden_layers": required_usize(raw, "num_hidden_layers")?,
        "num_attention_heads": heads,
        "num_key_value_heads": optional_usize(raw, "num_key_value_heads").unwrap_or(heads),
        "head_dim": optional_usize(raw, "head_dim").unwrap_or(hidden / heads),
        "vocab_size": required_usize(raw, "vocab_size")?,
        "rms_norm_eps": raw.get("rms_norm_eps").and_then(Value::as_f64).unwrap_or(1e-6),
        "rope_theta": rope_theta,
        "rope_scaling": rope_scaling,
        "attention_bias": architecture == "qwen2" || flag(raw, "attention_bias"),
        "qk_norm": architecture == "qwen3",
        "tie_word_embeddings": flag(raw, "tie_word_embeddings"),
        "max_position_embeddings": context_limit(raw, architecture)?,
    }))
}

fn architecture(raw: &Value) -> Result<&'static str, String> {
    let class = raw.get("architectures").and_then(|a| a.get(0)).and_then(Value::as_str);
    let model_type = raw.get("model_type").and_then(Value::as_str);
    let found = match class {
        Some(class) => ARCHITECTURE_BY_CLASS.iter().find(|(c, _)| *c == class),
        None => ARCHITECTURE_BY_CLASS.iter().find(|(_, arch)| Some(*arch) == model_type),
    };
    found.map(|(_, arch)| *arch).ok_or_else(|| {
        let name = class.or(model_type).unwrap_or("unknown");
        format!("the {name} architecture is not supported")
    })
}

/// (rope_theta, rope_scaling): transformers 4.x keeps them top-level, 5.x in `rope_parameters`.
fn rope(raw: &Value) -> Result<(f64, Value), String> {
    let parameters = raw.get("rope_parameters").filter(|p| p.is_object());
    let scaling = raw.get("rope_scaling").filter(|s| s.is_object()).or(parameters);
    let theta = parameters.and_then(|p| p.get("rope_theta")).or_else(|| raw.get("rope_theta")).and_then(Value::as_f64).unwrap_or(10000.0);
    let Some(scaling) = scaling else { return Ok((theta, Value::Null)) };
    let kind = scaling.get("rope_type").or_else(|| scaling.get("type")).and_then(Value::as_str).unwrap_or("default");
    match kind {
        "default" => Ok((theta, Value::Null)),
        "llama3" => {
            let mut llama3 = Map::from_iter([("rope_type".to_string(), json!("llama3"))]);
            for key in LLAMA3_ROPE_KEYS {
                let value = scaling.get(*key).ok_or_else(|| format!("llama3 rope scaling lacks {key}"))?;
                llama3.insert(key.to_string(), value.clone());
            }
            Ok((theta, Value::Object(llama3)))
        }
        other => Err(format!("{other:?} rope scaling is not supported")),
    }
}

/// The model's context, capped at its sliding window where one applies (the engine attends to
/// every position, which equals sliding-window attention only within the window).
fn context_limit(raw: &Value, architecture: &str) -> Result<usize, String> {
    let limit = required_usize(raw, "max_position_embeddings")?;
    let window = optional_usize(raw, "sliding_window");
    let applies = architecture == "mistral" || flag(raw, "use_sliding_window");
    Ok(match window {
        Some(window) if applies => limit.min(window),
        _ => limit,
    })
}

fn optional_usize(raw: &Value, key: &str) -> Option<usize> {
    raw.get(key).and_then(Value::as_u64).map(|v| v as usize)
}

fn required_usize(raw: &Value, key: &str) -> Result<usize, String> {
    optional_usize(raw, key).ok_or_else(|| format!("no positive integer {key:?}"))
}

fn flag(raw: &Value, key: &str) -> bool {
    raw.get(key).and_then(Value::as_bool).unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;

    /// A safetensors file (written by Hugging Face's crate) of float32 tensors (name, shape, values).
    fn f32_safetensors(tensors: &[(&str, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
        let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, _, values)| values.iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
        let views = tensors.iter().zip(&bytes).map(|((name, shape, _), data)| (*name, TensorView::new(Dtype::F32, shape.clone(), data).unwrap()));
        safetensors::serialize(views, None).unwrap()
    }

    #[test]
    fn normalizes_a_llama_config() {
        let raw = json!({
            "architectures": ["LlamaForCausalLM"], "hidden_size": 576, "intermediate_size": 1536,
            "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
            "vocab_size": 49152, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
            "max_position_embeddings": 8192, "tie_word_embeddings": true, "hidden_act": "silu",
        });
        let cfg = normalize_config(&raw).unwrap();
        assert_eq!((cfg["architecture"].as_str(), cfg["head_dim"].as_u64()), (Some("llama"), Some(64)));
        assert_eq!((cfg["rope_theta"].as_f64(), &cfg["rope_scaling"]), (Some(1e5), &Value::Null));
        rsgl_engine::ModelConfig::from_json(&cfg.to_string()).unwrap();
    }

    #[test]
    fn reads_llama3_rope_scaling_from_either_layout() {
        let scaling =
            json!({ "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192 });
        let v4 = json!({ "rope_theta": 5e5, "rope_scaling": scaling });
        let v5 = json!({ "rope_parameters": { "rope_theta": 5e5, "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192 } });
        assert_eq!(rope(&v4).unwrap(), (5e5, scaling.clone()));
        assert_eq!(rope(&v5).unwrap(), (5e5, scaling));
        assert!(rope(&json!({ "rope_scaling": { "rope_type": "yarn" } })).is_err());
    }

    #[test]
    fn loads_a_directory_and_ties_a_missing_lm_head() {
        let dir = std::env::temp_dir().join(format!("rsgl-bench-model-dir-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = json!({
            "model_type": "llama", "hidden_size": 2, "intermediate_size": 2, "num_hidden_layers": 1,
            "num_attention_heads": 1, "vocab_size": 3, "max_position_embeddings": 16,
        });
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
        let file = f32_safetensors(&[
            ("model.embed_tokens.weight", vec![3, 2], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]),
            ("model.layers.0.self_attn.rotary_emb.inv_freq", vec![1], vec![1.0]),
        ]);
        std::fs::write(dir.join("model.safetensors"), file).unwrap();
        let loaded = load(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        let mut loaded = loaded.unwrap();
        assert_eq!(loaded.config["tie_word_embeddings"], json!(true));
        assert_eq!(loaded.stored_dtypes.iter().collect::<Vec<_>>(), ["F32"]);
        assert_eq!(loaded.weights.remaining_names(), ["model.embed_tokens.weight"]);
        assert_eq!(loaded.weights.take("model.embed_tokens.weight", &[3, 2]).unwrap()[5], 6.0);
    }
}
