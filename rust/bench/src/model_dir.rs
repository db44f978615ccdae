//! A model directory for `rsgl-bench generate --model-dir`: a Hugging Face config.json and its
//! *.safetensors files (F32, BF16 or F16 tensors), read without Python.
//!
//! config.json is mapped onto the engine's normalized config the way the Python loader does it
//! (python/rsgl/loader/hf.py); safetensors is an 8-byte little-endian header length, a JSON
//! header (name -> dtype, shape, byte range) and the raw little-endian tensor data.

use rsgl_engine::WeightStore;
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Hugging Face model classes and the engine architecture each is.
const ARCHITECTURE_BY_CLASS: &[(&str, &str)] = &[
    ("LlamaForCausalLM", "llama"),
    ("MistralForCausalLM", "mistral"),
    ("Qwen2ForCausalLM", "qwen2"),
    ("Qwen3ForCausalLM", "qwen3"),
];
const LLAMA3_ROPE_KEYS: &[&str] = &["factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"];
/// Buffers some old checkpoints saved beside the weights; the engine recomputes them.
const IGNORED_SUFFIX: &str = "rotary_emb.inv_freq";

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

    let files = safetensors_paths(dir)?
        .into_iter()
        .map(|path| SafetensorsFile::read(&path))
        .collect::<Result<Vec<_>, _>>()?;
    let has_lm_head = files.iter().any(|f| f.tensors.iter().any(|t| t.name == "lm_head.weight"));
    let tied = config["tie_word_embeddings"].as_bool().unwrap_or(false) || !has_lm_head;
    config["tie_word_embeddings"] = json!(tied); // no lm_head: the output projection is the embedding

    let mut weights = WeightStore::new();
    let mut stored_dtypes = BTreeSet::new();
    for file in &files {
        for tensor in &file.tensors {
            // Tied: transformers ignores a saved lm_head too.
            if tensor.name.ends_with(IGNORED_SUFFIX) || (tied && tensor.name == "lm_head.weight") {
                continue;
            }
            stored_dtypes.insert(tensor.dtype.name().to_string());
            let values = file.values(tensor);
            weights.insert(&tensor.name, tensor.shape.clone(), values).map_err(|e| format!("{}: {e}", file.path.display()))?;
        }
    }
    Ok(ModelDir { config, weights, stored_dtypes })
}

fn safetensors_paths(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read the model directory {}: {e}", dir.display()))?;
    let mut paths: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "safetensors"))
        .collect();
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
    let theta = parameters
        .and_then(|p| p.get("rope_theta"))
        .or_else(|| raw.get("rope_theta"))
        .and_then(Value::as_f64)
        .unwrap_or(10000.0);
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

// ---------------------------------------------------------------------------------------------
// safetensors
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq)]
enum StoredDtype {
    F32,
    Bf16,
    F16,
}

impl StoredDtype {
    fn parse(name: &str) -> Option<StoredDtype> {
        match name {
            "F32" => Some(StoredDtype::F32),
            "BF16" => Some(StoredDtype::Bf16),
            "F16" => Some(StoredDtype::F16),
            _ => None,
        }
    }

    fn name(self) -> &'static str {
        match self {
            StoredDtype::F32 => "F32",
            StoredDtype::Bf16 => "BF16",
            StoredDtype::F16 => "F16",
        }
    }

    fn size(self) -> usize {
        match self {
            StoredDtype::F32 => 4,
            StoredDtype::Bf16 | StoredDtype::F16 => 2,
        }
    }

    fn to_f32(self, bytes: &[u8]) -> Vec<f32> {
        match self {
            StoredDtype::F32 => bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect(),
            StoredDtype::Bf16 => bytes.chunks_exact(2).map(|b| bf16_to_f32(u16::from_le_bytes([b[0], b[1]]))).collect(),
            StoredDtype::F16 => bytes.chunks_exact(2).map(|b| f16_to_f32(u16::from_le_bytes([b[0], b[1]]))).collect(),
        }
    }
}

/// bf16 is the top half of an f32.
fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// IEEE half to single: rebias the exponent (15 -> 127), widen the mantissa (10 -> 23 bits).
fn f16_to_f32(bits: u16) -> f32 {
    let sign = if bits & 0x8000 != 0 { -1.0 } else { 1.0 };
    let exponent = (bits >> 10) & 0x1f;
    let mantissa = (bits & 0x3ff) as u32;
    match exponent {
        0 => sign * mantissa as f32 * f32::powi(2.0, -24), // zero and subnormals
        0x1f => f32::from_bits(((bits as u32 & 0x8000) << 16) | 0x7f80_0000 | (mantissa << 13)), // inf, NaN
        _ => f32::from_bits(((bits as u32 & 0x8000) << 16) | ((exponent as u32 + 127 - 15) << 23) | (mantissa << 13)),
    }
}

#[derive(Debug)]
struct TensorEntry {
    name: String,
    dtype: StoredDtype,
    shape: Vec<usize>,
    /// Byte range within the data section.
    begin: usize,
    end: usize,
}

struct SafetensorsFile {
    path: PathBuf,
    bytes: Vec<u8>,
    data_start: usize,
    tensors: Vec<TensorEntry>,
}

impl SafetensorsFile {
    fn read(path: &Path) -> Result<SafetensorsFile, String> {
        let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let (tensors, data_start) = parse_header(&bytes).map_err(|e| format!("{} is not a usable safetensors file: {e}", path.display()))?;
        Ok(SafetensorsFile { path: path.to_path_buf(), bytes, data_start, tensors })
    }

    fn values(&self, tensor: &TensorEntry) -> Vec<f32> {
        tensor.dtype.to_f32(&self.bytes[self.data_start + tensor.begin..self.data_start + tensor.end])
    }
}

/// The tensors a file describes, each checked to fit its shape and the file; and where the data
/// section starts.
fn parse_header(bytes: &[u8]) -> Result<(Vec<TensorEntry>, usize), String> {
    let prefix: [u8; 8] = bytes.get(..8).and_then(|p| p.try_into().ok()).ok_or("too short for a header")?;
    let data_start = usize::try_from(u64::from_le_bytes(prefix)).ok().and_then(|n| n.checked_add(8)).ok_or("bad header length")?;
    let header = bytes.get(8..data_start).ok_or("the header runs past the end of the file")?;
    let header: Map<String, Value> = serde_json::from_slice(header).map_err(|e| format!("the header is not a JSON object: {e}"))?;
    let data_len = bytes.len() - data_start;
    let mut tensors = header
        .iter()
        .filter(|(name, _)| name.as_str() != "__metadata__")
        .map(|(name, entry)| tensor_entry(name, entry, data_len))
        .collect::<Result<Vec<_>, _>>()?;
    tensors.sort_by_key(|t| t.begin);
    Ok((tensors, data_start))
}

fn tensor_entry(name: &str, entry: &Value, data_len: usize) -> Result<TensorEntry, String> {
    let dtype_name = entry["dtype"].as_str().ok_or_else(|| format!("tensor {name} has no dtype"))?;
    let dtype = StoredDtype::parse(dtype_name).ok_or_else(|| format!("tensor {name} is {dtype_name}; only F32, BF16 and F16 are read"))?;
    let numbers = |key: &str| -> Option<Vec<usize>> {
        entry[key].as_array()?.iter().map(|v| v.as_u64().map(|n| n as usize)).collect()
    };
    let shape = numbers("shape").ok_or_else(|| format!("tensor {name} has no shape"))?;
    let (begin, end) = match numbers("data_offsets").as_deref() {
        Some(&[begin, end]) => (begin, end),
        _ => return Err(format!("tensor {name} has no data_offsets")),
    };
    let size = shape.iter().product::<usize>() * dtype.size();
    if begin > end || end > data_len || end - begin != size {
        return Err(format!("tensor {name}'s byte range {begin}..{end} does not fit its shape {shape:?} or the file"));
    }
    Ok(TensorEntry { name: name.to_string(), dtype, shape, begin, end })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A safetensors file holding `tensors` as (name, dtype, shape, raw bytes).
    fn safetensors(tensors: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
        let mut header = Map::new();
        let mut data = Vec::new();
        for (name, dtype, shape, bytes) in tensors {
            header.insert(name.to_string(), json!({ "dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()] }));
            data.extend_from_slice(bytes);
        }
        header.insert("__metadata__".into(), json!({ "format": "pt" }));
        let header = serde_json::to_vec(&header).unwrap();
        [(header.len() as u64).to_le_bytes().to_vec(), header, data].concat()
    }

    fn le_bytes<const N: usize, T: Copy>(values: &[T], to_bytes: fn(T) -> [u8; N]) -> Vec<u8> {
        values.iter().flat_map(|&v| to_bytes(v)).collect()
    }

    #[test]
    fn converts_half_floats_exactly() {
        let cases = [(0x3c00, 1.0), (0xc000, -2.0), (0x7bff, 65504.0), (0x0001, 5.960_464_5e-8), (0x8000, -0.0), (0x3555, 0.333_251_95)];
        for (bits, value) in cases {
            assert_eq!(f16_to_f32(bits), value, "f16 {bits:#06x}");
        }
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7e00).is_nan());
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert_eq!(bf16_to_f32(0xc0a0), -5.0);
    }

    #[test]
    fn reads_every_stored_dtype() {
        let file = safetensors(&[
            ("a", "F32", vec![2], le_bytes(&[1.5f32, -3.0], f32::to_le_bytes)),
            ("b", "BF16", vec![1, 2], le_bytes(&[0x3f80u16, 0x4000], u16::to_le_bytes)),
            ("c", "F16", vec![2, 1], le_bytes(&[0x3800u16, 0xbc00], u16::to_le_bytes)),
        ]);
        let (tensors, data_start) = parse_header(&file).unwrap();
        let read = |i: usize| tensors[i].dtype.to_f32(&file[data_start + tensors[i].begin..data_start + tensors[i].end]);
        assert_eq!(tensors.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!((read(0), read(1), read(2)), (vec![1.5, -3.0], vec![1.0, 2.0], vec![0.5, -1.0]));
        assert_eq!(tensors[2].shape, [2, 1]);
    }

    #[test]
    fn rejects_broken_files() {
        let good = safetensors(&[("a", "F32", vec![2], vec![0; 8])]);
        assert!(parse_header(&good[..good.len() - 1]).unwrap_err().contains("does not fit"));
        assert!(parse_header(&good[..4]).is_err());
        assert!(parse_header(&safetensors(&[("a", "F32", vec![3], vec![0; 8])])).is_err());
        assert!(parse_header(&safetensors(&[("q", "I8", vec![2], vec![0; 2])])).unwrap_err().contains("I8"));
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
        let scaling = json!({ "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192 });
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
        let embedding = le_bytes(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], f32::to_le_bytes);
        let inv_freq = le_bytes(&[1.0f32], f32::to_le_bytes);
        let file = safetensors(&[
            ("model.embed_tokens.weight", "F32", vec![3, 2], embedding),
            ("model.layers.0.self_attn.rotary_emb.inv_freq", "F32", vec![1], inv_freq),
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
