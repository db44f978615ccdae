//! A vision-language checkpoint's image encoder, from its config.json: SmolVLM's and Idefics3's
//! SigLIP-style tower, whose patches a pixel shuffle folds into fewer, wider tokens that one
//! linear layer projects into the language model.

use super::keys::Keys;
use super::qwen_vision;
use super::{ImageEncoder, VisionConfig};
use crate::error::Result;
use serde_json::{Map, Value};

/// Model types whose vision tower and projector rsgl runs.
const PIXEL_SHUFFLE_MODELS: [&str; 2] = ["smolvlm", "idefics3"];

/// The vision config of `raw` (the whole config.json, before its language model is taken out),
/// or None for a text-only model or one whose images rsgl does not read yet (it then runs on
/// text alone).
pub(super) fn vision_config(raw: &Map<String, Value>, remedy: &'static str) -> Result<Option<ImageEncoder>> {
    let model_type = raw.get("model_type").and_then(Value::as_str).unwrap_or_default();
    let Some(Value::Object(vision)) = raw.get("vision_config") else { return Ok(None) };
    if model_type == qwen_vision::MODEL_TYPE {
        return qwen_vision::vision_config(raw, vision, remedy).map(|tower| Some(ImageEncoder::Qwen2_5Vl(tower)));
    }
    if !PIXEL_SHUFFLE_MODELS.contains(&model_type) {
        return Ok(None);
    }
    let outer = Keys::new(raw, "config.json".into(), remedy);
    let tower = Keys::new(vision, "config.json's vision_config".into(), remedy);
    let config = VisionConfig {
        hidden_size: tower.count("hidden_size")?,
        intermediate_size: tower.count("intermediate_size")?,
        num_hidden_layers: tower.count("num_hidden_layers")?,
        num_attention_heads: tower.count("num_attention_heads")?,
        image_size: tower.count("image_size")?,
        patch_size: tower.count("patch_size")?,
        layer_norm_eps: tower.number("layer_norm_eps")?.unwrap_or(1e-6) as f32,
        scale_factor: outer.optional_count("scale_factor")?.unwrap_or(2),
        image_token_id: outer.count("image_token_id")? as u32,
    };
    let side = config.image_size / config.patch_size.max(1);
    if !config.image_size.is_multiple_of(config.patch_size.max(1))
        || !side.is_multiple_of(config.scale_factor.max(1))
        || !config.hidden_size.is_multiple_of(config.num_attention_heads.max(1))
    {
        return Err(outer.broken(format!(
            "its vision tower's image_size {} is not patches of {} that a pixel shuffle of {} folds evenly (or hidden_size {} is not {} heads)",
            config.image_size, config.patch_size, config.scale_factor, config.hidden_size, config.num_attention_heads
        )));
    }
    Ok(Some(ImageEncoder::Siglip(config)))
}

impl VisionConfig {
    /// Patches along each side of a tile.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// The language model's image tokens per tile, after the pixel shuffle.
    pub fn tokens_per_tile(&self) -> usize {
        (self.patches_per_side() / self.scale_factor).pow(2)
    }

    /// Values of one tile's pixels: 3 channels of `image_size` squared.
    pub fn values_per_tile(&self) -> usize {
        3 * self.image_size * self.image_size
    }
}

#[cfg(test)]
impl VisionConfig {
    /// A tower of 2 x 2 pixel tiles making one image token each (`image_token_id`), for tests of
    /// what happens around it.
    pub(crate) fn one_token_per_tile(image_token_id: u32) -> VisionConfig {
        VisionConfig {
            hidden_size: 4,
            intermediate_size: 4,
            num_hidden_layers: 1,
            num_attention_heads: 1,
            image_size: 2,
            patch_size: 1,
            layer_norm_eps: 1e-6,
            scale_factor: 2,
            image_token_id,
        }
    }
}
