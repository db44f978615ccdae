//! Qwen2.5-VL's vision tower and M-RoPE sections, from its config.json: the vision tower under
//! `vision_config` (transformers' `Qwen2_5_VLVisionConfig`, whose defaults fill what it leaves
//! out), the image token id at the top, and the language model's `mrope_section` in its rope
//! parameters (nested in `text_config` as transformers 5 saves it, or at the top level as the
//! checkpoints on the Hub have it). Or from llama.cpp's files: the tower from the projector
//! file's metadata, the sections and the image token from the language model's.

use super::keys::{quoted, Keys};
use super::{ImageEncoder, Qwen2_5VlVision};
use crate::error::{EngineError, Result};
use serde_json::{Map, Value};

pub(super) const MODEL_TYPE: &str = "qwen2_5_vl";
/// llama.cpp's name of Qwen2.5-VL's projector files (`clip.projector_type`).
pub(super) const PROJECTOR_TYPE: &str = "qwen2.5vl_merger";
/// The token an image's rows take the place of, in Qwen's vocabulary.
pub(super) const IMAGE_TOKEN: &str = "<|image_pad|>";
/// The window, in pixels, llama.cpp's Qwen2.5-VL tower attends within where the projector file
/// sets no `clip.vision.window_size` (its converter writes none): the released models' 112.
const GGUF_WINDOW_SIZE: usize = 112;
/// The vision tower's rope base, which neither kind of file gives (llama.cpp fixes it too).
const VISION_ROPE_THETA: f64 = 10000.0;

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
        rope_theta: rope_theta.unwrap_or(VISION_ROPE_THETA),
        image_token_id: outer.optional_count("image_token_id")?.unwrap_or(151655) as u32,
        mrope_section: mrope_section(raw, &outer)?,
    };
    config.check(&outer)?;
    Ok(config)
}

/// The vision tower of a projector file as llama.cpp's converter writes Qwen2.5-VL's (`general`:
/// its metadata, `tower`: the same under `clip.vision.`), for the language model whose GGUF
/// metadata is `text`: the tower's shape, its merger's output width `out_hidden_size` (the
/// projector's `projection_dim`), the blocks that see the whole image every `n_wa_pattern`th
/// (llama.cpp's rule: blocks n - 1, 2n - 1, ...; 0: all of them), and what llama.cpp assumes where
/// the file is silent (`GGUF_WINDOW_SIZE`, merges of 2 x 2 patches, 2 frames a patch). The
/// image token `image_token_id` was found in the language model's vocabulary.
pub(super) fn projector_config(
    general: &Keys,
    tower: &Keys,
    text: &Map<String, Value>,
    image_token_id: u32,
    out_hidden_size: usize,
) -> Result<Qwen2_5VlVision> {
    if !general.flag("clip.use_silu") {
        return Err(EngineError::UnsupportedModel(
            "this Qwen2.5-VL projector's MLP does not use silu (clip.use_silu), the only activation rsgl runs its tower with".into(),
        ));
    }
    let depth = tower.count("block_count")?;
    let fullatt_block_indexes = match tower.count("n_wa_pattern")? {
        0 => (0..depth).collect(),
        every => (0..depth).filter(|block| (block + 1) % every == 0).collect(),
    };
    let config = Qwen2_5VlVision {
        hidden_size: tower.count("embedding_length")?,
        intermediate_size: tower.count("feed_forward_length")?,
        depth,
        num_heads: tower.count("attention.head_count")?,
        patch_size: tower.count("patch_size")?,
        temporal_patch_size: 2,
        spatial_merge_size: tower.optional_count("spatial_merge_size")?.unwrap_or(2),
        window_size: tower.optional_count("window_size")?.unwrap_or(GGUF_WINDOW_SIZE),
        fullatt_block_indexes,
        out_hidden_size,
        rope_theta: VISION_ROPE_THETA,
        image_token_id,
        mrope_section: gguf_mrope_section(text)?,
    };
    config.check(tower)?;
    Ok(config)
}

/// The M-RoPE sections of a GGUF language model (`{architecture}.rope.dimension_sections`, where
/// llama.cpp's converter writes the config's `mrope_section` and a fourth, 0).
fn gguf_mrope_section(text: &Map<String, Value>) -> Result<[usize; 3]> {
    let architecture = text.get("general.architecture").and_then(Value::as_str).unwrap_or_default();
    let key = format!("{architecture}.rope.dimension_sections");
    let Some(sections) = text.get(&key).filter(|sections| !sections.is_null()) else {
        return Err(EngineError::ModelLoad(format!(
            "the language model has no M-RoPE sections ({key}), which place a Qwen2.5-VL projector's image tokens: it is not the language model of this projector"
        )));
    };
    match counts(sections).as_deref() {
        Some(&[t, h, w]) | Some(&[t, h, w, 0]) => Ok([t, h, w]),
        _ => Err(EngineError::ModelLoad(format!(
            "the language model's {key} {sections} is not three counts of rotary frequencies (and a 0); the file looks broken: download it again"
        ))),
    }
}

/// A JSON list of whole numbers; None for anything else.
fn counts(value: &Value) -> Option<Vec<usize>> {
    value.as_array()?.iter().map(|part| part.as_u64().map(|p| p as usize)).collect()
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
    match counts(section).as_deref() {
        Some(&[t, h, w]) => Ok([t, h, w]),
        _ => Err(outer.broken(format!("its mrope_section {section} is not three counts of rotary frequencies"))),
    }
}

impl Qwen2_5VlVision {
    /// Refuses a tower whose heads the 2D rope cannot split in four, or whose windows are not
    /// whole merged tokens.
    fn check(&self, keys: &Keys) -> Result<()> {
        let head_dim = self.hidden_size.checked_div(self.num_heads).unwrap_or(0);
        if head_dim == 0 || !self.hidden_size.is_multiple_of(self.num_heads) || !head_dim.is_multiple_of(4) {
            return Err(keys
                .broken(format!("its vision tower's hidden_size {} is not {} heads of a width the 2D rope splits in four", self.hidden_size, self.num_heads)));
        }
        if self.patch_size == 0 || self.temporal_patch_size == 0 || self.spatial_merge_size == 0 || self.merged_tokens_per_window() == 0 {
            return Err(keys.broken(format!(
                "its vision tower's window_size {} is not at least one {}-patch merge of {}-pixel patches",
                self.window_size, self.spatial_merge_size, self.patch_size
            )));
        }
        Ok(())
    }

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

    /// A projector file's metadata and its language model's, as llama.cpp's converter writes
    /// Qwen2.5-VL's (a 7-block tower, every 4th seeing the whole image), with `changes` made.
    fn from_projector(projector_changes: Value, text_changes: Value) -> Result<ImageEncoder> {
        let mut projector = json!({
            "clip.projector_type": "qwen2.5vl_merger", "clip.has_vision_encoder": true, "clip.use_silu": true,
            "clip.vision.projection_dim": 64, "clip.vision.embedding_length": 32, "clip.vision.feed_forward_length": 48,
            "clip.vision.block_count": 7, "clip.vision.attention.head_count": 2, "clip.vision.patch_size": 14,
            "clip.vision.image_size": 560, "clip.vision.n_wa_pattern": 4,
        });
        let mut text = json!({
            "general.architecture": "qwen2vl", "qwen2vl.rope.dimension_sections": [2, 3, 3, 0],
            "tokenizer.ggml.tokens": ["<s>", "a", "<|image_pad|>", "<image>"],
        });
        projector.as_object_mut().unwrap().extend(projector_changes.as_object().unwrap().clone());
        text.as_object_mut().unwrap().extend(text_changes.as_object().unwrap().clone());
        super::super::vision::projector_config(projector.as_object().unwrap(), "mmproj.gguf", text.as_object().unwrap(), 64)
    }

    #[test]
    fn reads_a_projector_file_as_llama_cpp_does() {
        let Ok(ImageEncoder::Qwen2_5Vl(tower)) = from_projector(json!({}), json!({})) else { panic!("a Qwen2.5-VL tower") };
        assert_eq!((tower.hidden_size, tower.intermediate_size, tower.depth, tower.num_heads, tower.out_hidden_size), (32, 48, 7, 2, 64));
        assert_eq!((tower.fullatt_block_indexes.clone(), tower.image_token_id, tower.mrope_section), (vec![3], 2, [2, 3, 3]));
        assert_eq!((tower.patch_size, tower.temporal_patch_size, tower.spatial_merge_size, tower.window_size, tower.rope_theta), (14, 2, 2, 112, 10000.0));
        let given = json!({"clip.vision.n_wa_pattern": 2, "clip.vision.window_size": 56, "clip.vision.spatial_merge_size": 1});
        let Ok(ImageEncoder::Qwen2_5Vl(tower)) = from_projector(given, json!({})) else { panic!("a Qwen2.5-VL tower") };
        assert_eq!((tower.fullatt_block_indexes, tower.window_size, tower.spatial_merge_size), (vec![1, 3, 5], 56, 1));
        let Ok(ImageEncoder::Qwen2_5Vl(tower)) = from_projector(json!({"clip.vision.n_wa_pattern": 0}), json!({})) else { panic!("a Qwen2.5-VL tower") };
        assert_eq!(tower.fullatt_block_indexes, (0..7).collect::<Vec<_>>(), "no windows");
        let Ok(ImageEncoder::Qwen2_5Vl(tower)) = from_projector(json!({}), json!({"qwen2vl.rope.dimension_sections": [4, 2, 2]})) else { panic!() };
        assert_eq!(tower.mrope_section, [4, 2, 2]);
    }

    #[test]
    fn refuses_projector_files_it_cannot_run() {
        let refusal = |projector: Value, text: Value| from_projector(projector, text).unwrap_err().to_string();
        let unsupported = refusal(json!({"clip.projector_type": "qwen2vl_merger"}), json!({}));
        assert!(unsupported.contains("'qwen2vl_merger' projector") && unsupported.contains("qwen2.5vl_merger (Qwen2.5-VL)"), "{unsupported}");
        assert!(refusal(json!({"clip.use_silu": false}), json!({})).contains("silu"));
        assert!(refusal(json!({"clip.vision.n_wa_pattern": null}), json!({})).contains("clip.vision.n_wa_pattern"));
        assert!(refusal(json!({"clip.vision.projection_dim": 48}), json!({})).contains("projector of another model"));
        assert!(refusal(json!({"clip.vision.window_size": 14}), json!({})).contains("window_size 14"));
        assert!(refusal(json!({}), json!({"tokenizer.ggml.tokens": ["<s>", "<image>"]})).contains("no <|image_pad|> token"));
        assert!(refusal(json!({}), json!({"qwen2vl.rope.dimension_sections": null})).contains("no M-RoPE sections (qwen2vl.rope.dimension_sections)"));
        assert!(refusal(json!({}), json!({"qwen2vl.rope.dimension_sections": [2, 3, 3, 1]})).contains("not three counts"));
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
