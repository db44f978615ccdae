//! A model directory for `rsgl-bench generate --model-dir`: a Hugging Face config.json and its
//! *.safetensors files, read without Python by the engine's own readers (the ones the Python
//! loader calls too).

use rsgl_engine::{ModelConfig, WeightStore};
use serde_json::Value;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

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
    let mut config = ModelConfig::from_hf_config(&mut serde_json::Deserializer::from_str(&text)).map_err(|e| format!("{}: {e}", dir.display()))?;

    let weights = WeightStore::open_safetensors(&safetensors_paths(dir)?).map_err(|e| e.to_string())?;
    // No lm_head: the output projection is the embedding (a saved one beside a tied embedding is
    // ignored by the model, as transformers ignores it).
    config.tie_word_embeddings |= !weights.contains("lm_head.weight");
    let config = serde_json::to_value(&config).expect("a config serializes");
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

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::TensorView;
    use safetensors::Dtype;
    use serde_json::json;

    /// A safetensors file (written by Hugging Face's crate) of float32 tensors (name, shape, values).
    fn f32_safetensors(tensors: &[(&str, Vec<usize>, Vec<f32>)]) -> Vec<u8> {
        let bytes: Vec<Vec<u8>> = tensors.iter().map(|(_, _, values)| values.iter().flat_map(|v| v.to_le_bytes()).collect()).collect();
        let views = tensors.iter().zip(&bytes).map(|((name, shape, _), data)| (*name, TensorView::new(Dtype::F32, shape.clone(), data).unwrap()));
        safetensors::serialize(views, None).unwrap()
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
