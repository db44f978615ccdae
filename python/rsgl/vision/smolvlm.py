"""SmolVLM and Idefics3 image preprocessing and prompt expansion, equal to transformers' (numpy and PIL, no torch).

`SmolVLMImages.preprocess` makes an image's tiles as transformers' `SmolVLMImageProcessorPil` does (its code is
`Idefics3ImageProcessorPil`'s):

1. resize so the longest edge is `size["longest_edge"]`, up or down; the other edge follows the aspect ratio,
   truncated, then rounded up to even; neither edge over 4096;
2. resize again so both edges are multiples of the tile size (`max_image_size["longest_edge"]`);
3. an image larger than one tile is cut into rows x cols tiles (row by row), followed by the whole image resized to
   one tile (the global image); an image of one tile is that tile alone, with rows = cols = 0;
4. each pixel times `rescale_factor` (1/255, in float64, then float32), then (x - mean) / std per channel (float32).

Every resize is PIL's, 8-bit RGB to 8-bit RGB, with the processor's filter (`resample`, LANCZOS for SmolVLM), as in
transformers. With `do_image_splitting` false, step 1 is followed by a resize to one tile instead.

Tiles are always square, one tile wide, so transformers' padding (of a batch's images to the largest) adds nothing to
one image's tiles, and its `pixel_attention_mask` for them is all ones: `preprocess` returns neither. Padding only
adds all-zero tiles to the shorter prompts of a batch, which the model drops again.

`SmolVLMImages.expand` writes each `<image>` placeholder of a rendered prompt out as transformers' processors
(`SmolVLMProcessor`, `Idefics3Processor`) do. A split image: per tile `<fake_token_around_image><row_R_col_C>` and
`image_seq_len` `<image>` tokens, a newline after each row; then a newline and the global image. An image of one tile:
the global image alone, `<fake_token_around_image><global-img>`, `image_seq_len` `<image>` tokens,
`<fake_token_around_image>`.

The values come from the model folder, as transformers reads them: the image processor's settings from
`processor_config.json`'s "image_processor" object, else `preprocessor_config.json`; `image_seq_len` from
`processor_config.json`. Settings a file leaves out take transformers' class defaults (SmolVLM's: longest edge
4 x 364, tiles of 364, LANCZOS, mean = std = 0.5, and 169 image tokens per tile), which are not SmolVLM-256M's.

A GGUF model has no such files: `from_projector` reads the settings llama.cpp's converter keeps in the projector
file (`clip.vision.*`: the tile size, the longest edge, mean and std; the patch size and scale factor, which make
`image_seq_len`), and the processor's for the rest (LANCZOS, 1/255, splitting on), so a GGUF model gets the tiles
and prompt of its Hugging Face folder. (llama.cpp itself resizes and splits a little differently: it always adds
the whole image, and rounds both edges up to tiles independently.)

HuggingFaceTB/SmolVLM-256M-Instruct (model_type idefics3, processor class Idefics3Processor) says:
preprocessor_config.json: size {"longest_edge": 2048}, max_image_size {"longest_edge": 512}, resample 1 (LANCZOS),
mean = std = 0.5, rescale_factor 1/255, splitting on; processor_config.json: image_seq_len 64; config.json: a SigLIP
base vision encoder of image_size 512 and patch_size 16, and scale_factor 4, so a tile's (512 / 16)^2 = 1024 patches
become 1024 / 4^2 = 64 tokens. Every image is scaled to a longest edge of 2048, so it becomes at most 4 x 4 tiles of
512 plus the global image: a square image 17 x 64 = 1088 image tokens, a 4:3 photo 3 x 4 + 1 tiles (832 tokens), a
3:1 panorama 2 x 4 + 1 tiles (576 tokens), each with its marker tokens besides.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from rsgl._core import WeightStore
from rsgl._typing import JsonObject
from rsgl.errors import InvalidRequestError, ModelLoadError
from rsgl.loader import read_optional_json_object
from rsgl.vision.images import to_rgb
from rsgl.vision.pixels import FloatPixels, PixelSteps, ProcessedImage

IMAGE_TOKEN = "<image>"
FAKE_IMAGE_TOKEN = "<fake_token_around_image>"
GLOBAL_IMAGE_TOKEN = "<global-img>"

# transformers caps the first resize's edges at 4096 ("4k resolution as absolute maximum").
_MAX_EDGE = 4096
# SmolVLMImageProcessorPil's class defaults and SmolVLMProcessor's image_seq_len default.
_DEFAULT_LONGEST_EDGE = 4 * 364
_DEFAULT_TILE_SIZE = 364
_DEFAULT_MEAN_STD = 0.5
_DEFAULT_IMAGE_SEQ_LEN = 169
# Projector files written before llama.cpp kept the longest edge (clip.vision.preproc_image_size): 4 tiles, as every
# SmolVLM and Idefics3 processor sets it.
_TILES_PER_LONGEST_EDGE = 4


@dataclass(frozen=True)
class SmolVLMImages:
    """A SmolVLM / Idefics3 model's image preprocessing; `from_folder` reads it from a model folder."""

    tile_size: int
    image_seq_len: int
    # The first resize: to this longest edge, or to this (height, width); neither with do_resize false.
    longest_edge: int | None
    resize_to: tuple[int, int] | None
    split: bool
    pixel_steps: PixelSteps

    @classmethod
    def from_folder(cls, path: str | Path) -> SmolVLMImages:
        """Raises ModelLoadError if the folder has no image processor settings or they are unusable."""
        folder = Path(path)
        processor = read_optional_json_object(folder / "processor_config.json")
        nested = processor.get("image_processor")
        settings = nested if isinstance(nested, dict) else read_optional_json_object(folder / "preprocessor_config.json")
        if not settings:
            raise ModelLoadError(f"{folder} has no image processor settings (preprocessor_config.json, or processor_config.json's image_processor)")
        try:
            images = cls._from_settings(settings, processor.get("image_seq_len", _DEFAULT_IMAGE_SEQ_LEN))
        except (KeyError, TypeError, ValueError) as error:
            raise ModelLoadError(f"{folder}: unusable image processor settings ({error!r})") from error
        images._check_tokens_per_tile(read_optional_json_object(folder / "config.json"), folder)
        return images

    @classmethod
    def from_projector(cls, path: str | Path) -> SmolVLMImages:
        """The preprocessing a GGUF model's projector file (llama.cpp's mmproj-*.gguf, projector type idefics3) sets
        in its metadata. Raises ModelLoadError if its settings are missing or unusable."""
        metadata = WeightStore.gguf_metadata(path)
        try:
            tile, patch = int(metadata["clip.vision.image_size"]), int(metadata["clip.vision.patch_size"])
            scale_factor = int(metadata.get("clip.vision.projector.scale_factor", 2))
            settings: JsonObject = {
                "size": {"longest_edge": int(metadata.get("clip.vision.preproc_image_size") or _TILES_PER_LONGEST_EDGE * tile)},
                "max_image_size": {"longest_edge": tile},
                "image_mean": metadata["clip.vision.image_mean"],
                "image_std": metadata["clip.vision.image_std"],
            }
            return cls._from_settings(settings, (tile // patch) ** 2 // scale_factor**2)
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
            raise ModelLoadError(f"{path}: unusable image preprocessing settings in its metadata ({error!r}); download the projector file again") from error

    @classmethod
    def _from_settings(cls, settings: JsonObject, image_seq_len: int) -> SmolVLMImages:
        size = settings.get("size", {"longest_edge": _DEFAULT_LONGEST_EDGE})
        longest_edge = resize_to = None
        if settings.get("do_resize", True):
            if size.get("longest_edge"):
                longest_edge = int(size["longest_edge"])
            else:
                resize_to = (int(size["height"]), int(size["width"]))
        return cls(
            tile_size=int(settings.get("max_image_size", {"longest_edge": _DEFAULT_TILE_SIZE})["longest_edge"]),
            image_seq_len=int(image_seq_len),
            longest_edge=longest_edge,
            resize_to=resize_to,
            split=bool(settings.get("do_image_splitting", True)),
            pixel_steps=PixelSteps.from_config(settings, Image.Resampling.LANCZOS, mean=_DEFAULT_MEAN_STD, std=_DEFAULT_MEAN_STD),
        )

    def _check_tokens_per_tile(self, config: JsonObject, folder: Path) -> None:
        """The vision encoder makes (tile / patch)^2 patches of a tile, the connector merges scale_factor^2 of them
        into one token: a processor writing another number of `<image>` tokens would not match the model."""
        vision = config.get("vision_config")
        if not isinstance(vision, dict) or "patch_size" not in vision or "scale_factor" not in config:
            return
        tokens = (self.tile_size // vision["patch_size"]) ** 2 // config["scale_factor"] ** 2
        if tokens != self.image_seq_len:
            raise ModelLoadError(
                f"{folder}: the processor writes {self.image_seq_len} <image> tokens per tile, but config.json's vision encoder"
                f" (patch_size {vision['patch_size']}, scale_factor {config['scale_factor']}) makes {tokens} of a {self.tile_size}-pixel tile"
            )

    def preprocess(self, image: Image.Image) -> tuple[FloatPixels, int, int]:
        """`image`'s pixel values, float32 [tiles, 3, tile_size, tile_size] (the global image last), and its tile
        rows and columns (0 and 0 for an image of one tile), as transformers' SmolVLMImageProcessorPil gives them."""
        image = to_rgb(image)
        resize = self.pixel_steps.resized
        if self.longest_edge is not None:
            image = resize(image, *_longest_edge_size(image.height, image.width, self.longest_edge))
        elif self.resize_to is not None:
            image = resize(image, *self.resize_to)
        tile = self.tile_size
        rows = cols = 0
        if not self.split:
            tiles = [np.asarray(resize(image, tile, tile))]
        else:
            image = resize(image, *_tile_multiple_size(image.height, image.width, tile))
            pixels = np.asarray(image)
            if image.height > tile or image.width > tile:
                rows, cols = image.height // tile, image.width // tile
                tiles = [pixels[row * tile : (row + 1) * tile, col * tile : (col + 1) * tile] for row in range(rows) for col in range(cols)]
                tiles.append(np.asarray(resize(image, tile, tile)))
            else:
                tiles = [pixels]
        return self.pixel_steps.values(np.stack(tiles)), rows, cols

    def expand(self, text: str, images_rows_cols: Sequence[tuple[int, int]]) -> str:
        """`text` with its i-th `<image>` written out for an image of `images_rows_cols[i]` (rows, cols) tiles.
        Raises InvalidRequestError if the placeholders and the images are not as many."""
        pieces = text.split(IMAGE_TOKEN)
        if len(pieces) - 1 != len(images_rows_cols):
            raise InvalidRequestError(f"the prompt has {len(pieces) - 1} {IMAGE_TOKEN} placeholders for {len(images_rows_cols)} images")
        expanded = [pieces[0]]
        for (rows, cols), piece in zip(images_rows_cols, pieces[1:]):
            expanded += [self.image_prompt(rows, cols), piece]
        return "".join(expanded)

    def expand_images(self, text: str, images: Sequence[Image.Image]) -> tuple[str, list[ProcessedImage]]:
        """`text` with its i-th `<image>` written out for `images[i]`, and each image's tiles (see `preprocess`)."""
        tiled = [self.preprocess(image) for image in images]
        return self.expand(text, [(rows, cols) for _, rows, cols in tiled]), [ProcessedImage(pixels) for pixels, _, _ in tiled]

    def image_prompt(self, rows: int, cols: int) -> str:
        """The text one image of rows x cols tiles (0 x 0: a single tile) stands for in the prompt."""
        image_tokens = IMAGE_TOKEN * self.image_seq_len
        global_image = f"{FAKE_IMAGE_TOKEN}{GLOBAL_IMAGE_TOKEN}{image_tokens}{FAKE_IMAGE_TOKEN}"
        if rows == 0 and cols == 0:
            return global_image
        grid = "".join("".join(f"{FAKE_IMAGE_TOKEN}<row_{row}_col_{col}>{image_tokens}" for col in range(1, cols + 1)) + "\n" for row in range(1, rows + 1))
        return f"{grid}\n{global_image}"


def _longest_edge_size(height: int, width: int, longest_edge: int) -> tuple[int, int]:
    """The first resize's (height, width), in transformers' float arithmetic (its truncations decide edge pixels)."""
    aspect = width / height
    if width >= height:
        height, width = _round_up_to_even(int(longest_edge / aspect)), longest_edge
    else:
        height, width = longest_edge, _round_up_to_even(int(longest_edge * aspect))
    height, width = max(height, 1), max(width, 1)
    aspect = width / height
    if width >= height and width > _MAX_EDGE:
        height, width = max(int(_MAX_EDGE / aspect), 1), _MAX_EDGE
    elif height > width and height > _MAX_EDGE:
        height, width = _MAX_EDGE, max(int(_MAX_EDGE * aspect), 1)
    return height, width


def _tile_multiple_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """The (height, width) that holds whole tiles: the longer edge rounded up to tiles, the other edge scaled with
    it (truncated) and rounded up to tiles, as transformers' resize_for_vision_encoder computes it."""
    aspect = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / aspect) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * aspect) / tile) * tile
    return height, width


def _round_up_to_even(length: int) -> int:
    return length + length % 2
