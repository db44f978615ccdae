//! A prompt's images: which prompt positions each one's rows fill, and the rows once its
//! vision tower has run.

use crate::config::{ImageEncoder, Qwen2_5VlVision, VisionConfig};
use crate::error::{invalid, Result};
use crate::request::ImageInput;
use std::borrow::Cow;
use std::ops::Range;
use std::sync::Arc;

pub(crate) struct PromptImage {
    pub input: ImageInput,
    /// The prompt positions of its image tokens, in order.
    pub positions: Vec<usize>,
    /// The language model's rows for those positions, once encoded (`[positions, hidden]`).
    pub rows: Option<Arc<[f32]>>,
}

impl PromptImage {
    /// Not placed yet: see [`place`].
    pub fn new(input: ImageInput) -> PromptImage {
        PromptImage { input, positions: Vec::new(), rows: None }
    }

    /// What the prefix cache keys its `k`-th position by in place of the image token: an id
    /// from the image's hash and `k`, above every vocabulary (bit 31 set), so two pictures
    /// never share a key (a chance of 2^-31 per position, for every position of the image).
    fn cache_id(&self, k: usize) -> u32 {
        let mixed = super::kv::stable_hash(self.input.hash.as_bytes()) ^ (k as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mixed = (mixed ^ (mixed >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        0x8000_0000 | (mixed >> 33) as u32
    }

    /// Its tiles' pixel values as floats.
    pub fn pixels(&self) -> Vec<f32> {
        self.input.pixel_values.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()
    }
}

/// Checks that `images` fit the prompt's image tokens: each takes as many in a row as its tiles
/// (or patches) give, and they must add up to all of them. Returns how many each takes.
pub(crate) fn check<'a>(images: impl IntoIterator<Item = &'a ImageInput>, prompt: &[u32], vision: Option<&ImageEncoder>) -> Result<Vec<usize>> {
    let mut images = images.into_iter().peekable();
    if images.peek().is_none() {
        return Ok(Vec::new());
    }
    let vision = vision.ok_or_else(|| invalid("this model does not read images; send text only"))?;
    let tokens = images
        .enumerate()
        .map(|(i, image)| match vision {
            ImageEncoder::Siglip(siglip) => siglip_tokens(i, image, siglip),
            ImageEncoder::Qwen2_5Vl(qwen) => qwen_tokens(i, image, qwen),
        })
        .collect::<Result<Vec<usize>>>()?;
    let image_token_id = vision.image_token_id();
    let (found, needed) = (prompt.iter().filter(|&&t| t == image_token_id).count(), tokens.iter().sum::<usize>());
    if found != needed {
        return Err(invalid(format!("the prompt has {found} image tokens (id {image_token_id}) but its images need {needed}")));
    }
    Ok(tokens)
}

/// The tokens of image `i` for a SigLIP tower: its tiles' tokens.
fn siglip_tokens(i: usize, image: &ImageInput, vision: &VisionConfig) -> Result<usize> {
    let bytes_per_tile = vision.values_per_tile() * 4;
    let bytes = image.pixel_values.len();
    if bytes == 0 || !bytes.is_multiple_of(bytes_per_tile) {
        return Err(invalid(format!(
            "images[{i}]: pixel_values must be whole tiles of 3 x {0} x {0} float32 values ({bytes_per_tile} bytes each); got {bytes} bytes",
            vision.image_size
        )));
    }
    Ok(bytes / bytes_per_tile * vision.tokens_per_tile())
}

/// The tokens of image `i` for Qwen2.5-VL's tower: its grid's patches, merged.
fn qwen_tokens(i: usize, image: &ImageInput, vision: &Qwen2_5VlVision) -> Result<usize> {
    let merge = vision.spatial_merge_size;
    let Some([frames, rows, columns]) = image.grid_thw.filter(|&[t, h, w]| t > 0 && h > 0 && w > 0 && h.is_multiple_of(merge) && w.is_multiple_of(merge))
    else {
        return Err(invalid(format!("images[{i}]: a Qwen2.5-VL image needs grid_thw, its patch grid, with rows and columns multiples of {merge}")));
    };
    let patches = frames * rows * columns;
    let bytes = image.pixel_values.len();
    if bytes != patches * vision.values_per_patch() * 4 {
        return Err(invalid(format!(
            "images[{i}]: pixel_values must be {patches} patches of {} float32 values for grid_thw {:?}; got {bytes} bytes",
            vision.values_per_patch(),
            [frames, rows, columns]
        )));
    }
    Ok(patches / vision.patches_per_token())
}

/// Places `images` on the prompt's image tokens, in order (see [`check`]).
pub(crate) fn place(images: &mut [PromptImage], prompt: &[u32], vision: Option<&ImageEncoder>) -> Result<()> {
    let tokens = check(images.iter().map(|image| &image.input), prompt, vision)?;
    let Some(vision) = vision else { return Ok(()) };
    let image_token_id = vision.image_token_id();
    let mut slots = prompt.iter().enumerate().filter(|&(_, &t)| t == image_token_id).map(|(p, _)| p);
    for (image, count) in images.iter_mut().zip(tokens) {
        image.positions = slots.by_ref().take(count).collect();
    }
    Ok(())
}

/// `tokens` (a request's first ones) as the prefix cache keys them: each image's positions hold
/// its [`PromptImage::cache_id`]s, so prompts share KV up to the first image that differs,
/// their text before it included.
pub(crate) fn cache_key<'a>(images: &[PromptImage], tokens: &'a [u32]) -> Cow<'a, [u32]> {
    if images.is_empty() {
        return Cow::Borrowed(tokens);
    }
    let mut key = tokens.to_vec();
    for image in images {
        for (k, &p) in image.positions.iter().enumerate().take_while(|&(_, &p)| p < tokens.len()) {
            key[p] = image.cache_id(k);
        }
    }
    Cow::Owned(key)
}

/// The runs of consecutive image tokens of placed `images` (the blocks Gemma 3 attends both
/// ways), in order.
pub(crate) fn runs(images: &[PromptImage]) -> Vec<Range<usize>> {
    let mut runs: Vec<Range<usize>> = Vec::new();
    for &p in images.iter().flat_map(|image| &image.positions) {
        match runs.last_mut() {
            Some(run) if run.end == p => run.end += 1,
            _ => runs.push(p..p + 1),
        }
    }
    runs
}

/// The rows images give at positions `range`: `(position - range.start, row)`.
pub(crate) fn rows_in(images: &[PromptImage], range: Range<usize>) -> Vec<(usize, &[f32])> {
    let mut rows = Vec::new();
    for image in images {
        let Some(values) = &image.rows else { continue };
        let width = values.len() / image.positions.len();
        for (k, &p) in image.positions.iter().enumerate().filter(|(_, p)| range.contains(p)) {
            rows.push((p - range.start, &values[k * width..(k + 1) * width]));
        }
    }
    rows
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vision() -> ImageEncoder {
        ImageEncoder::Siglip(VisionConfig::one_token_per_tile(9))
    }

    fn image(tiles: usize) -> PromptImage {
        picture(tiles, "h")
    }

    fn picture(tiles: usize, hash: &str) -> PromptImage {
        PromptImage::new(ImageInput { hash: hash.into(), pixel_values: vec![0; tiles * 3 * 2 * 2 * 4], grid_thw: None })
    }

    fn placed(mut images: Vec<PromptImage>, prompt: &[u32], vision: Option<&ImageEncoder>) -> Result<Vec<PromptImage>> {
        place(&mut images, prompt, vision).map(|()| images)
    }

    #[test]
    fn images_take_their_tokens_in_order_and_counts_must_match() {
        // One token per tile (2x2 patches, shuffled by 2).
        let prompt = [1, 9, 2, 9, 9, 3];
        let images = placed(vec![image(1), image(2)], &prompt, Some(&vision())).unwrap();
        assert_eq!(images[0].positions, [1]);
        assert_eq!(images[1].positions, [3, 4]);
        assert!(placed(vec![image(1)], &prompt, Some(&vision())).is_err(), "two image tokens left over");
        assert!(placed(vec![image(2), image(2)], &prompt, Some(&vision())).is_err(), "one token short");
        assert!(placed(vec![image(1)], &prompt, None).is_err(), "a text model");
        let ragged = PromptImage::new(ImageInput { hash: "h".into(), pixel_values: vec![0; 7], grid_thw: None });
        assert!(placed(vec![ragged], &prompt, Some(&vision())).is_err());
    }

    #[test]
    fn cache_keys_hold_the_text_and_name_each_image_position_by_its_picture() {
        let prompt = [1, 9, 2, 9, 9, 3];
        let key = |hashes: [&str; 2]| {
            let images = placed(vec![picture(1, hashes[0]), picture(2, hashes[1])], &prompt, Some(&vision())).unwrap();
            cache_key(&images, &prompt).into_owned()
        };
        let (a, again, other_second) = (key(["a", "b"]), key(["a", "b"]), key(["a", "c"]));
        assert_eq!(a, again, "the same pictures: the same key");
        assert_eq!([a[0], a[2], a[5]], [1, 2, 3], "text keeps its tokens");
        assert!([a[1], a[3], a[4]].iter().all(|&id| id >= 1 << 31), "image positions hold ids above any vocabulary: {a:?}");
        assert_ne!(a[3], a[4], "each position of an image its own id");
        assert_eq!(a[..3], other_second[..3], "shared up to the first image that differs");
        assert_ne!(a[3..5], other_second[3..5]);
        assert_eq!(*cache_key(&[], &prompt), prompt, "a text prompt is its own key");
        let images = placed(vec![picture(1, "a"), picture(2, "b")], &prompt, Some(&vision())).unwrap();
        assert_eq!(*cache_key(&images, &prompt[..4]), a[..4], "a prefix's key is the key's prefix");
    }

    #[test]
    fn rows_fall_on_the_positions_of_a_range() {
        let prompt = [1, 9, 2, 9, 9, 3];
        let mut images = placed(vec![image(1), image(2)], &prompt, Some(&vision())).unwrap();
        images[0].rows = Some(vec![1.0, 1.0].into());
        images[1].rows = Some(vec![2.0, 2.0, 3.0, 3.0].into());
        let rows = rows_in(&images, 2..6);
        assert_eq!(rows, vec![(1, &[2.0, 2.0][..]), (2, &[3.0, 3.0][..])]);
    }

    #[test]
    fn runs_are_consecutive_image_tokens_whatever_image_they_belong_to() {
        let prompt = [9, 1, 9, 9, 9, 2];
        let images = placed(vec![image(1), image(1), image(2)], &prompt, Some(&vision())).unwrap();
        assert_eq!(runs(&images), [0..1, 2..5]);
        assert!(runs(&[]).is_empty());
    }
}
