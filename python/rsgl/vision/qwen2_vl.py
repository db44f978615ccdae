"""Image preprocessing for Qwen2-VL and Qwen2.5-VL (both use transformers' `Qwen2VLImageProcessor`),
the prompt's image placeholders expanded as `Qwen2_5_VLProcessor` does, and the 3D (M-RoPE)
positions of a prompt with images, as `Qwen2_5_VLModel.get_rope_index` computes them.

An image is resized so both sides are multiples of `patch_size * merge_size` (28) and its area lies
in [min_pixels, max_pixels] (`smart_resize`), with Pillow's bicubic filter; rescaled by 1/255 and
normalized with CLIP's mean and std; cut into `patch_size` squares, each repeated over
`temporal_patch_size` frames (a still image is a two-frame video to the vision tower's 3D patch
embedding). The vision tower merges each `merge_size` x `merge_size` window of patches into one
token, so an image takes grid_t * grid_h * grid_w / merge_size**2 `<|image_pad|>` tokens.

The numbers of Qwen2.5-VL-3B-Instruct (transformers' `Qwen2_5_VLVisionConfig` defaults, and the
checkpoint's preprocessor_config.json): patch_size 14, spatial merge_size 2, temporal_patch_size 2,
so 3 * 2 * 14 * 14 = 1176 values per patch and one token per 28 x 28 pixels; min_pixels 3136
(56 * 56, at least 4 tokens) and max_pixels 12845056 (16384 tokens). Without min_pixels / max_pixels
in the config, transformers' defaults are 56 * 56 and 28 * 28 * 1280 (1280 tokens).

A GGUF model's settings are in its projector file's metadata (`from_projector`), which lacks the pixel bounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt
from PIL import Image

from rsgl._core import WeightStore
from rsgl._typing import JsonObject
from rsgl.errors import InvalidRequestError, ModelLoadError
from rsgl.vision.images import to_rgb
from rsgl.vision.pixels import FloatPixels, PixelSteps, ProcessedImage, preprocessor_config

# OpenAI CLIP's per-channel statistics, transformers' default for this processor.
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

IMAGE_TOKEN = "<|image_pad|>"
# transformers' pixel bounds where a config sets none: at least 4 tokens, at most 1280.
DEFAULT_MIN_PIXELS, DEFAULT_MAX_PIXELS = 56 * 56, 28 * 28 * 1280
# Images longer than this many times their width (or wider than their height) are refused, as transformers does.
MAX_ASPECT_RATIO = 200

GridTHW = tuple[int, int, int]


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """The (height, width) an image is resized to: each side rounded to a multiple of `factor`, then,
    if the area is outside [min_pixels, max_pixels], both sides scaled by one factor to bring it
    inside (rounded down when shrinking, up when growing), keeping the aspect ratio as near as the
    multiples allow. Floating-point steps follow transformers' order, so sizes agree to the pixel."""
    if max(height, width) / min(height, width) > MAX_ASPECT_RATIO:
        raise InvalidRequestError(f"an image of {width}x{height} pixels is too elongated: the long side may be at most {MAX_ASPECT_RATIO} times the short one")
    resized_height = round(height / factor) * factor
    resized_width = round(width / factor) * factor
    if resized_height * resized_width > max_pixels:
        shrink = math.sqrt(height * width / max_pixels)
        resized_height = max(factor, math.floor(height / shrink / factor) * factor)
        resized_width = max(factor, math.floor(width / shrink / factor) * factor)
    elif resized_height * resized_width < min_pixels:
        grow = math.sqrt(min_pixels / (height * width))
        resized_height = math.ceil(height * grow / factor) * factor
        resized_width = math.ceil(width * grow / factor) * factor
    return resized_height, resized_width


@dataclass(frozen=True)
class Qwen2VLImageProcessor:
    """A Qwen2-VL / Qwen2.5-VL checkpoint's image preprocessing (its preprocessor_config.json)."""

    patch_size: int
    temporal_patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    pixel_steps: PixelSteps

    @classmethod
    def from_folder(cls, path: str | Path) -> Qwen2VLImageProcessor:
        """From a model folder's preprocessor_config.json; keys it leaves out take transformers' defaults.
        Top-level `min_pixels` / `max_pixels` win over `size`'s `shortest_edge` / `longest_edge`."""
        folder = Path(path)
        config = preprocessor_config(folder)
        size = config.get("size") or {"shortest_edge": DEFAULT_MIN_PIXELS, "longest_edge": DEFAULT_MAX_PIXELS}
        min_pixels = config.get("min_pixels", size.get("shortest_edge"))
        max_pixels = config.get("max_pixels", size.get("longest_edge"))
        if min_pixels is None or max_pixels is None:
            raise ModelLoadError(
                f"{folder / 'preprocessor_config.json'} gives no pixel bounds: set min_pixels and max_pixels, or size's shortest_edge and longest_edge"
            )
        return cls(
            patch_size=config.get("patch_size", 14),
            temporal_patch_size=config.get("temporal_patch_size", 2),
            merge_size=config.get("merge_size", 2),
            min_pixels=min_pixels,
            max_pixels=max_pixels,
            pixel_steps=PixelSteps.from_config(config, Image.Resampling.BICUBIC, mean=CLIP_MEAN, std=CLIP_STD),
        )

    @classmethod
    def from_projector(cls, path: str | Path) -> Qwen2VLImageProcessor:
        """The preprocessing a GGUF model's projector file (llama.cpp's mmproj-*.gguf, projector type
        qwen2.5vl_merger) sets in its metadata: the patch size, the merge size (`clip.vision.spatial_merge_size`,
        else 2), mean and std; the pixel bounds from `clip.vision.image_min_pixels` / `image_max_pixels`, which
        llama.cpp's converter does not write, else transformers' defaults (56 * 56 and 28 * 28 * 1280, not the
        released checkpoints' 3136 and 12845056); the rest as transformers' processor does it (bicubic, 1/255, 2
        frames a patch). llama.cpp itself resizes to between 8 and 4096 tokens' worth, whatever the file says.
        Raises ModelLoadError if its settings are missing or unusable."""
        metadata = WeightStore.gguf_metadata(path)
        try:
            settings: JsonObject = {"image_mean": metadata["clip.vision.image_mean"], "image_std": metadata["clip.vision.image_std"]}
            return cls(
                patch_size=int(metadata["clip.vision.patch_size"]),
                temporal_patch_size=2,
                merge_size=int(metadata.get("clip.vision.spatial_merge_size", 2)),
                min_pixels=int(metadata.get("clip.vision.image_min_pixels", DEFAULT_MIN_PIXELS)),
                max_pixels=int(metadata.get("clip.vision.image_max_pixels", DEFAULT_MAX_PIXELS)),
                pixel_steps=PixelSteps.from_config(settings, Image.Resampling.BICUBIC, mean=CLIP_MEAN, std=CLIP_STD),
            )
        except (KeyError, TypeError, ValueError) as error:
            raise ModelLoadError(f"{path}: unusable image preprocessing settings in its metadata ({error!r}); download the projector file again") from error

    def resized_size(self, height: int, width: int) -> tuple[int, int]:
        """The (height, width) an image of `height` x `width` pixels is resized to."""
        return smart_resize(height, width, self.patch_size * self.merge_size, self.min_pixels, self.max_pixels)

    def preprocess(self, image: Image.Image) -> tuple[FloatPixels, GridTHW]:
        """The vision tower's input for one image: pixel values [grid_t * grid_h * grid_w,
        channels * temporal_patch_size * patch_size**2] (float32) and (grid_t, grid_h, grid_w) in
        patches (grid_t is 1 for an image).

        Rows are patches, ordered window by window (the `merge_size` x `merge_size` groups of
        patches the vision tower merges into one token, in row-major order over the image), then
        row-major within a window. A row holds, for each channel, each temporal frame (the same
        image repeated), the patch's pixels row by row."""
        rgb = to_rgb(image)
        height, width = self.resized_size(rgb.height, rgb.width)
        pixels = self.pixel_steps.values(np.asarray(self.pixel_steps.resized(rgb, height, width)))
        patch, merge, frames = self.patch_size, self.merge_size, self.temporal_patch_size
        channels = pixels.shape[0]
        grid_h, grid_w = height // patch, width // patch
        # [channel, window row, row in window, pixel row, window column, column in window, pixel column]
        split = pixels.reshape(channels, grid_h // merge, merge, patch, grid_w // merge, merge, patch)
        # -> [window row, window column, row in window, column in window, channel, 1 frame, pixel row, pixel column]
        patches = split.transpose(1, 4, 2, 5, 0, 3, 6)[:, :, :, :, :, np.newaxis]
        repeated = np.broadcast_to(patches, (*patches.shape[:5], frames, patch, patch))
        # The reshape copies the broadcast view into one contiguous array.
        return repeated.reshape(grid_h * grid_w, channels * frames * patch * patch), (1, grid_h, grid_w)

    def image_token_count(self, grid_thw: GridTHW) -> int:
        """The number of `<|image_pad|>` tokens an image of this patch grid takes in the prompt."""
        grid_t, grid_h, grid_w = grid_thw
        return grid_t * grid_h * grid_w // self.merge_size**2

    def expand_images(self, text: str, images: Sequence[Image.Image]) -> tuple[str, list[ProcessedImage]]:
        """`text` with its i-th `<|image_pad|>` repeated for `images[i]`, and each image's patches and grid (see `preprocess`)."""
        patched = [self.preprocess(image) for image in images]
        return self.expand(text, [grid for _, grid in patched]), [ProcessedImage(pixels, grid) for pixels, grid in patched]

    def expand(self, text: str, grid_thws: Sequence[GridTHW]) -> str:
        """`text` with its i-th `<|image_pad|>` repeated to image i's token count. Every occurrence
        counts, whatever surrounds it (the chat template puts each between `<|vision_start|>` and
        `<|vision_end|>`); there must be one per image."""
        pieces = text.split(IMAGE_TOKEN)
        if len(pieces) - 1 != len(grid_thws):
            raise InvalidRequestError(f"the prompt has {len(pieces) - 1} {IMAGE_TOKEN} placeholders for {len(grid_thws)} images")
        expanded = [pieces[0]]
        for grid_thw, piece in zip(grid_thws, pieces[1:]):
            expanded += [IMAGE_TOKEN * self.image_token_count(grid_thw), piece]
        return "".join(expanded)


def mrope_positions(input_ids: Sequence[int], image_token_id: int, grid_thws: Sequence[GridTHW], spatial_merge_size: int) -> tuple[npt.NDArray[np.int64], int]:
    """The multimodal rotary positions of a prompt with images (no video): an int64 array
    [3, len(input_ids)] of (temporal, height, width) positions, and the M-RoPE position delta.

    Each image is one run of `image_token_id` tokens, grid_t * H * W long (H = grid_h /
    spatial_merge_size and W = grid_w / spatial_merge_size, the merged grid), in the order of
    `grid_thws` (the patch grids `preprocess` returned). With `p` the position after the preceding
    token (0 at the start):
      - a text token takes position p in all three components, and the next token p + 1;
      - an image's token at (frame, row, column) of its merged grid, in that row-major order, takes
        (p + frame, p + row, p + column); the token after the image takes p + max(H, W).
    The delta is (largest position + 1) - len(input_ids): a token generated after the prompt at
    index i (i >= len(input_ids)) takes i + delta in all three components."""
    ids = np.asarray(input_ids, dtype=np.int64)
    positions = np.empty((3, len(ids)), dtype=np.int64)
    image_token_at = np.flatnonzero(ids == image_token_id)
    merged_grids = [(grid_t, grid_h // spatial_merge_size, grid_w // spatial_merge_size) for grid_t, grid_h, grid_w in grid_thws]
    tokens_per_image = [grid_t * merged_h * merged_w for grid_t, merged_h, merged_w in merged_grids]
    if sum(tokens_per_image) != len(image_token_at):
        raise InvalidRequestError(f"the prompt has {len(image_token_at)} image tokens, but its {len(grid_thws)} images take {sum(tokens_per_image)}")
    next_position = 0
    cursor = 0  # the first index not yet given positions
    for (grid_t, merged_h, merged_w), image_tokens, first_token in zip(merged_grids, tokens_per_image, np.cumsum([0, *tokens_per_image])):
        start = int(image_token_at[first_token])
        end = start + image_tokens
        if not np.all(ids[start:end] == image_token_id):
            raise InvalidRequestError(f"an image of {image_tokens} tokens has a shorter run of image tokens in the prompt (at index {start})")
        positions[:, cursor:start] = next_position + np.arange(start - cursor)
        next_position += start - cursor
        frame, row, column = np.meshgrid(np.arange(grid_t), np.arange(merged_h), np.arange(merged_w), indexing="ij")
        positions[:, start:end] = next_position + np.stack([frame.ravel(), row.ravel(), column.ravel()])
        next_position += max(merged_h, merged_w)
        cursor = end
    positions[:, cursor:] = next_position + np.arange(len(ids) - cursor)
    return positions, int(positions.max()) + 1 - len(ids)
