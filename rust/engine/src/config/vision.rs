//! A vision-language checkpoint's image encoder, from its config.json or from the metadata of
//! llama.cpp's separate projector file (`mmproj-*.gguf`): a SigLIP-style tower whose patches a
//! projector folds into fewer tokens of the language model's width (Qwen2.5-VL's own tower in
//! `qwen_vision`). SmolVLM's and Idefics3's
//! pixel shuffle puts each square of patches side by side and projects it; Gemma 3's averages
//! each square, normalizes and projects it, and its language model attends both ways within
//! each image.

use super::keys::Keys;
use super::qwen_vision;
use super::{ImageEncoder, VisionConfig, VisionProjector};
use crate::error::{EngineError, Result};
use serde_json::{Map, Value};

/// Model types whose vision tower and projector rsgl runs.
const PIXEL_SHUFFLE_MODELS: [&str; 2] = ["smolvlm", "idefics3"];
const AVERAGE_POOL_MODELS: [&str; 1] = ["gemma3"];

/// A kind of llama.cpp's projector files that rsgl reads: what its type (`clip.projector_type`)
/// says that its metadata does not.
struct ProjectorType {
    /// llama.cpp's name.
    name: &'static str,
    /// The models whose projectors are of this type, for messages.
    models: &'static str,
    /// The token of the language model's vocabulary an image's rows take the place of.
    image_token: &'static str,
    /// A SigLIP tower's projector and the factor llama.cpp's converter leaves out when it is the
    /// family's usual one; None for Qwen2.5-VL's own tower.
    siglip: Option<(VisionProjector, usize)>,
}

const PROJECTOR_TYPES: [ProjectorType; 3] = [
    // transformers defaults SmolVLM's scale_factor to 2.
    ProjectorType { name: "idefics3", models: "SmolVLM, Idefics3", image_token: "<image>", siglip: Some((VisionProjector::PixelShuffle, 2)) },
    // Gemma 3 pools 64 x 64 patches to 16 x 16 tokens.
    ProjectorType { name: "gemma3", models: "Gemma 3", image_token: "<image_soft_token>", siglip: Some((VisionProjector::AveragePool, 4)) },
    ProjectorType { name: qwen_vision::PROJECTOR_TYPE, models: "Qwen2.5-VL", image_token: qwen_vision::IMAGE_TOKEN, siglip: None },
];

/// The vision config of `raw` (the whole config.json, before its language model is taken out),
/// or None for a text-only model or one whose images rsgl does not read yet (it then runs on
/// text alone).
pub(super) fn vision_config(raw: &Map<String, Value>, remedy: &'static str) -> Result<Option<ImageEncoder>> {
    let model_type = raw.get("model_type").and_then(Value::as_str).unwrap_or_default();
    let Some(Value::Object(vision)) = raw.get("vision_config") else { return Ok(None) };
    let projector = match model_type {
        qwen_vision::MODEL_TYPE => return qwen_vision::vision_config(raw, vision, remedy).map(|tower| Some(ImageEncoder::Qwen2_5Vl(tower))),
        _ if PIXEL_SHUFFLE_MODELS.contains(&model_type) => VisionProjector::PixelShuffle,
        _ if AVERAGE_POOL_MODELS.contains(&model_type) => VisionProjector::AveragePool,
        _ => return Ok(None),
    };
    let outer = Keys::new(raw, "config.json".into(), remedy);
    let tower = Keys::new(vision, "config.json's vision_config".into(), remedy);
    let (image_size, patch_size) = (tower.count("image_size")?, tower.count("patch_size")?);
    let side = image_size / patch_size.max(1);
    let (scale_factor, image_token_id) = match projector {
        VisionProjector::PixelShuffle => (outer.optional_count("scale_factor")?.unwrap_or(2), outer.count("image_token_id")?),
        // Pooled to mm_tokens_per_image tokens, a square of them; transformers 4 writes the
        // image token's id as image_token_index.
        VisionProjector::AveragePool => {
            let tokens = outer.optional_count("mm_tokens_per_image")?.unwrap_or(256);
            let per_side = tokens.isqrt();
            if per_side == 0 || per_side * per_side != tokens || !side.is_multiple_of(per_side) {
                return Err(outer.broken(format!("its mm_tokens_per_image {tokens} is not a square whose side divides the tower's {side} patches a side")));
            }
            (side / per_side, outer.first_count(&["image_token_id", "image_token_index"])?)
        }
    };
    let config = VisionConfig {
        hidden_size: tower.count("hidden_size")?,
        intermediate_size: tower.count("intermediate_size")?,
        num_hidden_layers: tower.count("num_hidden_layers")?,
        num_attention_heads: tower.count("num_attention_heads")?,
        image_size,
        patch_size,
        layer_norm_eps: tower.number("layer_norm_eps")?.unwrap_or(1e-6) as f32,
        scale_factor,
        projector,
        image_token_id: image_token_id as u32,
        bidirectional_image_tokens: projector == VisionProjector::AveragePool,
        // Gemma 3's checkpoints store its projector norm's `w`, which scales by `1 + w`.
        projector_norm_offset: if projector == VisionProjector::AveragePool { 1.0 } else { 0.0 },
    };
    config.check(&outer)?;
    Ok(Some(ImageEncoder::Siglip(config)))
}

/// The image encoder of a projector file (`projector`: its metadata, read from `source`) for the
/// GGUF language model whose metadata is `text` and embedding width `text_hidden`, as llama.cpp's
/// converter writes them: the tower's shape under `clip.vision.*`, the projector and image token
/// by its type ([`PROJECTOR_TYPES`]), the image token's id from the model's vocabulary.
pub(super) fn projector_config(projector: &Map<String, Value>, source: &str, text: &Map<String, Value>, text_hidden: usize) -> Result<ImageEncoder> {
    let remedy = "the projector file looks broken: download it again";
    let general = Keys::new(projector, format!("{source}'s metadata"), remedy);
    let kind = general.get("clip.projector_type").and_then(Value::as_str).unwrap_or_default();
    let Some(projector_type) = PROJECTOR_TYPES.iter().find(|known| known.name == kind).filter(|_| general.flag("clip.has_vision_encoder")) else {
        let what = if kind.is_empty() { "no vision projector".to_string() } else { format!("a '{kind}' projector") };
        let known: Vec<String> = PROJECTOR_TYPES.iter().map(|known| format!("{} ({})", known.name, known.models)).collect();
        return Err(EngineError::UnsupportedModel(format!(
            "{source} holds {what}; rsgl reads images through projector files of type {}: run the model on text alone without it",
            known.join(", ")
        )));
    };
    let tower = Keys::new(projector, format!("{source}'s metadata"), remedy).prefixed("clip.vision.".into());
    let projection_dim = tower.count("projection_dim")?;
    if projection_dim != text_hidden {
        return Err(EngineError::ModelLoad(format!(
            "{source} projects images to {projection_dim} values per token, but the language model's tokens have {text_hidden}: it is the projector of another model; pass the one made with the model"
        )));
    }
    let image_token = projector_type.image_token;
    let tokens = text.get("tokenizer.ggml.tokens").and_then(Value::as_array);
    let image_token_id = tokens.and_then(|tokens| tokens.iter().position(|token| token.as_str() == Some(image_token))).ok_or_else(|| {
        EngineError::ModelLoad(format!(
            "the language model has no {image_token} token in its vocabulary, which {source}'s images take the place of: it is the projector of another model"
        ))
    })? as u32;
    let Some((projector, default_scale_factor)) = projector_type.siglip else {
        return qwen_vision::projector_config(&general, &tower, text, image_token_id, projection_dim).map(ImageEncoder::Qwen2_5Vl);
    };
    let config = VisionConfig {
        hidden_size: tower.count("embedding_length")?,
        intermediate_size: tower.count("feed_forward_length")?,
        num_hidden_layers: tower.count("block_count")?,
        num_attention_heads: tower.count("attention.head_count")?,
        image_size: tower.count("image_size")?,
        patch_size: tower.count("patch_size")?,
        layer_norm_eps: tower.number("attention.layer_norm_epsilon")?.unwrap_or(1e-6) as f32,
        scale_factor: tower.optional_count("projector.scale_factor")?.unwrap_or(default_scale_factor),
        projector,
        image_token_id,
        bidirectional_image_tokens: projector == VisionProjector::AveragePool,
        // llama.cpp's converter stores Gemma 3's projector norm as the `1 + w` it scales by.
        projector_norm_offset: 0.0,
    };
    config.check(&tower)?;
    Ok(ImageEncoder::Siglip(config))
}

impl VisionConfig {
    /// Refuses a tower whose tiles are not whole patches that the projector's squares fold evenly.
    fn check(&self, keys: &Keys) -> Result<()> {
        let side = self.image_size / self.patch_size.max(1);
        if !self.image_size.is_multiple_of(self.patch_size.max(1))
            || !side.is_multiple_of(self.scale_factor.max(1))
            || !self.hidden_size.is_multiple_of(self.num_attention_heads.max(1))
        {
            return Err(keys.broken(format!(
                "its vision tower's image_size {} is not patches of {} that squares of {} fold evenly (or hidden_size {} is not {} heads)",
                self.image_size, self.patch_size, self.scale_factor, self.hidden_size, self.num_attention_heads
            )));
        }
        Ok(())
    }

    /// Patches along each side of a tile.
    pub fn patches_per_side(&self) -> usize {
        self.image_size / self.patch_size
    }

    /// The language model's image tokens per tile, after the projector.
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
            projector: VisionProjector::PixelShuffle,
            image_token_id,
            bidirectional_image_tokens: false,
            projector_norm_offset: 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Gemma 3 4B's projector file's metadata (its tower one layer deep), `extra` added.
    fn gemma3_projector(extra: Value) -> Map<String, Value> {
        let mut metadata = json!({
            "clip.has_vision_encoder": true, "clip.projector_type": "gemma3", "clip.vision.projection_dim": 2560,
            "clip.vision.embedding_length": 1152, "clip.vision.feed_forward_length": 4304, "clip.vision.block_count": 1,
            "clip.vision.attention.head_count": 16, "clip.vision.image_size": 896, "clip.vision.patch_size": 14,
            "clip.vision.attention.layer_norm_epsilon": 1e-6,
        });
        metadata.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        metadata.as_object().unwrap().clone()
    }

    #[test]
    fn a_gemma3_projector_file_pools_into_its_image_tokens() {
        let text = json!({"tokenizer.ggml.tokens": ["<pad>", "<start_of_image>", "<image_soft_token>"]});
        let text = text.as_object().unwrap();
        let siglip = |encoder: ImageEncoder| match encoder {
            ImageEncoder::Siglip(config) => config,
            ImageEncoder::Qwen2_5Vl(_) => panic!("Gemma 3's tower is SigLIP's"),
        };
        let config = siglip(projector_config(&gemma3_projector(json!({})), "mmproj.gguf", text, 2560).unwrap());
        assert_eq!((config.projector, config.scale_factor, config.tokens_per_tile()), (VisionProjector::AveragePool, 4, 256));
        assert_eq!((config.image_token_id, config.bidirectional_image_tokens, config.projector_norm_offset), (2, true, 0.0));
        // A test model's pool factor, which the converter writes only when it is not 4.
        let pooled_by_two = siglip(projector_config(&gemma3_projector(json!({"clip.vision.projector.scale_factor": 2})), "mmproj.gguf", text, 2560).unwrap());
        assert_eq!((pooled_by_two.scale_factor, pooled_by_two.tokens_per_tile()), (2, 1024));
        let without_token = json!({"tokenizer.ggml.tokens": ["<pad>", "<image>"]});
        let error = projector_config(&gemma3_projector(json!({})), "mmproj.gguf", without_token.as_object().unwrap(), 2560).unwrap_err().to_string();
        assert!(error.contains("no <image_soft_token> token"), "{error}");
        let error = projector_config(&gemma3_projector(json!({"clip.projector_type": "llama4"})), "mmproj.gguf", text, 2560).unwrap_err().to_string();
        assert!(error.contains("a 'llama4' projector") && error.contains("gemma3 (Gemma 3)"), "{error}");
    }
}
