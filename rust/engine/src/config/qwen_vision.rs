//! Qwen2.5-VL's vision tower and M-RoPE sections, from its config.json: the vision tower under
//! `vision_config` (transformers' `Qwen2_5_VLVisionConfig`, whose defaults fill what it leaves
//! out), the image token id at the top, and the language model's `mrope_section` in its rope
//! parameters (nested in `text_config` as transformers 5 saves it, or at the top level as the
//! checkpoints on the Hub have it).

use super::keys::{quoted, Keys};
use super::{ImageEncoder, Qwen2_5VlVision};
use crate::error::{EngineError, Result};
use serde_json::{Map, Value};

pub(super) const MODEL_TYPE: &str = "qwen2_5_vl";

/// transformers' default sections (`Qwen2_5_VLRotaryEmbedding`): 16 + 24 + 24 of a 128-wide
/// head's 64 frequencies.
const DEFAULT_MROPE_SECTION: [usize; 3] = [16, 24, 24];

pub(super) fn vision_config(raw: &Map<String, Value>, vision: &Map<String, Value>, remedy: &'static str) -> Result<Qwen2_5VlVision> {
    let outer = Keys::new(raw, "config.json".into(), remedy);
    let tower = Keys::new(vision, "config.json's vision_config".into(), remedy);
    if let Some(activation) = tower.get("hidden_act").filter(|act| act.as_str() != Some("silu")) {
        return Err(EngineError::UnsupportedModel(format!("this Qwen2.5-VL vision tower's MLP uses {}; rsgl runs it with silu only", quoted(activation))));
    }
    let channels = tower.get("in_channels").or_else(|| tower.get("in_chans")).and_then(Value::as_u64).unwrap_or(3);
    if channels != 3 {
        return Err(outer.broken(format!("its vision tower reads {channels} channels, not RGB's 3")));
    }
    let rope_theta = match tower.get("rope_parameters").and_then(Value::as_object) {
        Some(parameters) => Keys::new(parameters, "config.json's vision_config.rope_parameters".into(), remedy).number("rope_theta")?,
        None => tower.number("rope_theta")?,
    };
    let fullatt_block_indexes = match tower.get("fullatt_block_indexes") {
        Some(Value::Array(indexes)) => indexes
            .iter()
            .map(|index| index.as_u64().map(|i| i as usize))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| outer.broken("its vision_config's fullatt_block_indexes are not layer numbers".into()))?,
        Some(_) => return Err(outer.broken("its vision_config's fullatt_block_indexes is not a list".into())),
        None => vec![7, 15, 23, 31],
    };
    let config = Qwen2_5VlVision {
        hidden_size: tower.count("hidden_size")?,
        intermediate_size: tower.count("intermediate_size")?,
        depth: tower.count("depth")?,
        num_heads: tower.count("num_heads")?,
        patch_size: tower.optional_count("patch_size")?.unwrap_or(14),
        temporal_patch_size: tower.optional_count("temporal_patch_size")?.unwrap_or(2),
        spatial_merge_size: tower.optional_count("spatial_merge_size")?.unwrap_or(2),
        window_size: tower.optional_count("window_size")?.unwrap_or(112),
        fullatt_block_indexes,
        out_hidden_size: tower.count("out_hidden_size")?,
        rope_theta: rope_theta.unwrap_or(10000.0),
        image_token_id: outer.optional_count("image_token_id")?.unwrap_or(151655) as u32,
        mrope_section: mrope_section(raw, &outer)?,
    };
    let head_dim = config.hidden_size.checked_div(config.num_heads).unwrap_or(0);
    if head_dim == 0 || !config.hidden_size.is_multiple_of(config.num_heads) || !head_dim.is_multiple_of(4) {
        return Err(outer
            .broken(format!("its vision tower's hidden_size {} is not {} heads of a width the 2D rope splits in four", config.hidden_size, config.num_heads)));
    }
    if config.patch_size == 0 || config.temporal_patch_size == 0 || config.spatial_merge_size == 0 || config.merged_tokens_per_window() == 0 {
        return Err(outer.broken(format!(
            "its vision tower's window_size {} is not at least one {}-patch merge of {}-pixel patches",
            config.window_size, config.spatial_merge_size, config.patch_size
        )));
    }
    Ok(config)
}

/// The language model's `mrope_section`: in transformers 5's nested `text_config` or a flat
/// config's rope parameters (transformers 4's `rope_scaling` with `"type": "mrope"`).
fn mrope_section(raw: &Map<String, Value>, outer: &Keys) -> Result<[usize; 3]> {
    let text = raw.get("text_config").and_then(Value::as_object);
    let section = [text, Some(raw)]
        .into_iter()
        .flatten()
        .flat_map(|config| ["rope_parameters", "rope_scaling"].map(|key| config.get(key).and_then(Value::as_object)))
        .flatten()
        .find_map(|rope| rope.get("mrope_section"));
    let Some(section) = section else { return Ok(DEFAULT_MROPE_SECTION) };
    let parts: Option<Vec<usize>> = section.as_array().map(|parts| parts.iter().filter_map(|part| part.as_u64().map(|p| p as usize)).collect());
    match parts.as_deref() {
        Some(&[t, h, w]) if section.as_array().is_some_and(|parts| parts.len() == 3) => Ok([t, h, w]),
        _ => Err(outer.broken(format!("its mrope_section {section} is not three counts of rotary frequencies"))),
    }
}

impl Qwen2_5VlVision {
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_heads
    }

    /// Values of one patch: 3 channels of `temporal_patch_size` frames of `patch_size` squared.
    pub fn values_per_patch(&self) -> usize {
        3 * self.temporal_patch_size * self.patch_size * self.patch_size
    }

    /// Patches one language-model token merges.
    pub fn patches_per_token(&self) -> usize {
        self.spatial_merge_size * self.spatial_merge_size
    }

    /// A window's side in merged tokens.
    pub fn merged_tokens_per_window(&self) -> usize {
        self.window_size / self.spatial_merge_size / self.patch_size
    }
}

impl ImageEncoder {
    /// The prompt tokens an image's rows take the place of.
    pub fn image_token_id(&self) -> u32 {
        match self {
            ImageEncoder::Siglip(siglip) => siglip.image_token_id,
            ImageEncoder::Qwen2_5Vl(qwen) => qwen.image_token_id,
        }
    }

    /// The M-RoPE sections of the language model's rotary frequencies (temporal, height, width)
    /// where its image tokens take 3D positions.
    pub fn mrope_section(&self) -> Option<[usize; 3]> {
        match self {
            ImageEncoder::Siglip(_) => None,
            ImageEncoder::Qwen2_5Vl(qwen) => Some(qwen.mrope_section),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parsed(config: Value) -> Result<Qwen2_5VlVision> {
        let raw = config.as_object().unwrap().clone();
        let vision = raw["vision_config"].as_object().unwrap().clone();
        vision_config(&raw, &vision, "fix it")
    }

    #[test]
    fn reads_nested_and_flat_configs_with_transformers_defaults() {
        let vision = json!({"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 64, "fullatt_block_indexes": [1]});
        let nested = parsed(json!({
            "model_type": "qwen2_5_vl", "image_token_id": 9, "vision_config": vision,
            "text_config": {"rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]}},
        }))
        .unwrap();
        assert_eq!((nested.mrope_section, nested.image_token_id, nested.fullatt_block_indexes.clone()), ([2, 3, 3], 9, vec![1]));
        assert_eq!((nested.patch_size, nested.temporal_patch_size, nested.spatial_merge_size, nested.window_size, nested.rope_theta), (14, 2, 2, 112, 10000.0));
        let flat =
            parsed(json!({"model_type": "qwen2_5_vl", "vision_config": vision, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}})).unwrap();
        assert_eq!((flat.mrope_section, flat.image_token_id), ([16, 24, 24], 151655));
        assert_eq!((flat.values_per_patch(), flat.merged_tokens_per_window(), flat.head_dim()), (3 * 2 * 14 * 14, 4, 16));
    }

    #[test]
    fn refuses_what_it_does_not_run() {
        let vision = |extra: Value| {
            let mut v = json!({"depth": 1, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "out_hidden_size": 64});
            v.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
            json!({"model_type": "qwen2_5_vl", "vision_config": v})
        };
        assert!(parsed(vision(json!({"hidden_act": "gelu"}))).is_err());
        assert!(parsed(vision(json!({"num_heads": 3}))).is_err());
        assert!(parsed(vision(json!({"window_size": 14}))).is_err());
        let mut bad_section = vision(json!({}));
        bad_section["rope_scaling"] = json!({"mrope_section": [16, 24]});
        assert!(parsed(bad_section).is_err());
    }
}
