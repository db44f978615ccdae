"""Image preprocessing for Gemma 3 (transformers' `Gemma3ImageProcessor`) and the prompt's image
placeholders expanded as `Gemma3Processor` does.

An image is converted to RGB, resized to the SigLIP tower's square input with Pillow's bilinear
filter (whatever its aspect ratio), rescaled by 1/255 and normalized with mean 0.5 and std 0.5 per
channel (values in [-1, 1]). In the prompt, each `<start_of_image>` (the chat template writes one
per image) becomes `\\n\\n<start_of_image>`, `image_seq_length` `<image_soft_token>` tokens (the
tower's output pooled to a fixed count) and `<end_of_image>\\n\\n`.

The numbers of Gemma 3 4B-27B (their preprocessor_config.json and transformers' `Gemma3Config`):
896 x 896 pixels (64 x 64 patches of 14), 256 tokens per image (`mm_tokens_per_image`, pooled 4 x 4).

Pan and scan (off by default) adds crops of an elongated image, each preprocessed like a whole
image and given its own token sequence after the original's. transformers' `Gemma3Processor` runs
it only when a call asks for it (`do_pan_and_scan=True`), whatever preprocessor_config.json says,
with its own fixed settings (`PanAndScan`'s defaults); here it is the `pan_and_scan` argument of
`from_folder`.

A GGUF model has no such files: `from_projector` reads the settings llama.cpp's converter keeps in
the projector file (`clip.vision.*`), and the processor's for the rest (bilinear, 1/255), so a GGUF
model gets the pixels and prompt of its Hugging Face folder.
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
from rsgl.vision.pixels import FloatPixels, PixelSteps, ProcessedImage, preprocessor_config

BOI_TOKEN = "<start_of_image>"
EOI_TOKEN = "<end_of_image>"
IMAGE_TOKEN = "<image_soft_token>"
# Gemma 3's projector averages each 4 x 4 square of patches into one token.
_DEFAULT_POOL_FACTOR = 4


@dataclass(frozen=True)
class PanAndScan:
    """When and how an image is cut into crops along its long side: only if the long side is at
    least `min_ratio_to_activate` times the short one, into round(long / short) crops (2 at least,
    `max_num_crops` at most, and no more than fit at `min_crop_size` pixels each); none if the
    crops would be narrower than `min_crop_size`."""

    min_crop_size: int = 256
    max_num_crops: int = 4
    min_ratio_to_activate: float = 1.2

    def crop_boxes(self, width: int, height: int) -> list[tuple[int, int, int, int]]:
        """The crops' (left, top, right, bottom) boxes, row by row; the last crop in a row or column
        stops at the image's edge."""
        long_side, short_side = max(width, height), min(width, height)
        if long_side / short_side < self.min_ratio_to_activate:
            return []
        crops = int(math.floor(long_side / short_side + 0.5))
        crops = min(self.max_num_crops, max(2, min(long_side // self.min_crop_size, crops)))
        columns, rows = (crops, 1) if width >= height else (1, crops)
        crop_width, crop_height = math.ceil(width / columns), math.ceil(height / rows)
        if min(crop_width, crop_height) < self.min_crop_size:
            return []
        return [
            (left, top, min(left + crop_width, width), min(top + crop_height, height))
            for top in range(0, rows * crop_height, crop_height)
            for left in range(0, columns * crop_width, crop_width)
        ]


@dataclass(frozen=True)
class Gemma3ImageProcessor:
    """A Gemma 3 checkpoint's image preprocessing (preprocessor_config.json) and prompt expansion
    (processor_config.json's image_seq_length)."""

    height: int
    width: int
    pixel_steps: PixelSteps
    image_seq_length: int
    pan_and_scan: PanAndScan | None = None

    @classmethod
    def from_folder(cls, path: str | Path, pan_and_scan: bool = False) -> Gemma3ImageProcessor:
        """From a model folder's preprocessor_config.json and processor_config.json; keys they leave
        out take transformers' defaults. `pan_and_scan` adds crops of elongated images (see the module)."""
        folder = Path(path)
        config = preprocessor_config(folder)
        processor_config = read_optional_json_object(folder / "processor_config.json")
        size = config.get("size") or {"height": 224, "width": 224}
        return cls(
            height=size["height"],
            width=size["width"],
            pixel_steps=PixelSteps.from_config(config, Image.Resampling.BILINEAR, mean=0.5, std=0.5),
            image_seq_length=processor_config.get("image_seq_length", 256),
            pan_and_scan=PanAndScan() if pan_and_scan else None,
        )

    @classmethod
    def from_projector(cls, path: str | Path) -> Gemma3ImageProcessor:
        """The preprocessing a GGUF model's projector file (llama.cpp's mmproj-*.gguf, projector type gemma3) sets in
        its metadata: the tower's square input and its mean and std; the tokens per image from its patches and pool
        factor (`clip.vision.projector.scale_factor`, which llama.cpp's converter writes only when it is not
        Gemma 3's 4). Raises ModelLoadError if they are missing or unusable."""
        metadata = WeightStore.gguf_metadata(path)
        try:
            size, patch = int(metadata["clip.vision.image_size"]), int(metadata["clip.vision.patch_size"])
            pooled_side = size // patch // int(metadata.get("clip.vision.projector.scale_factor", _DEFAULT_POOL_FACTOR))
            settings: JsonObject = {"image_mean": metadata["clip.vision.image_mean"], "image_std": metadata["clip.vision.image_std"]}
            return cls(
                height=size,
                width=size,
                pixel_steps=PixelSteps.from_config(settings, Image.Resampling.BILINEAR, mean=0.5, std=0.5),
                image_seq_length=pooled_side**2,
            )
        except (KeyError, TypeError, ValueError, ZeroDivisionError) as error:
            raise ModelLoadError(f"{path}: unusable image preprocessing settings in its metadata ({error!r}); download the projector file again") from error

    def preprocess(self, image: Image.Image) -> FloatPixels:
        """The vision tower's input for one image: float32 [1 + crops, 3, height, width], the whole
        image then its pan-and-scan crops (none unless pan and scan is on)."""
        rgb = to_rgb(image)
        boxes = self.pan_and_scan.crop_boxes(rgb.width, rgb.height) if self.pan_and_scan else []
        views = [rgb, *(rgb.crop(box) for box in boxes)]
        steps = self.pixel_steps
        return steps.values(np.stack([np.asarray(steps.resized(view, self.height, self.width)) for view in views]))

    @property
    def image_sequence(self) -> str:
        """The text one view of an image (the whole image or a crop) takes in the prompt."""
        return f"\n\n{BOI_TOKEN}{IMAGE_TOKEN * self.image_seq_length}{EOI_TOKEN}\n\n"

    def expand(self, text: str, crops_per_image: Sequence[int]) -> str:
        """`text` with its i-th `<start_of_image>` replaced by image i's token sequence; one entry of
        `crops_per_image` per image: its pixel values' length minus one (0 without pan and scan)."""
        pieces = text.split(BOI_TOKEN)
        if len(pieces) - 1 != len(crops_per_image):
            raise InvalidRequestError(f"the prompt has {len(pieces) - 1} {BOI_TOKEN} placeholders for {len(crops_per_image)} images")
        expanded = [pieces[0]]
        for crops, piece in zip(crops_per_image, pieces[1:]):
            expanded += [self.image_text(crops), piece]
        return "".join(expanded)

    def expand_images(self, text: str, images: Sequence[Image.Image]) -> tuple[str, list[ProcessedImage]]:
        """`text` with its i-th `<start_of_image>` written out for `images[i]`, and each image's views (see `preprocess`)."""
        views = [self.preprocess(image) for image in images]
        return self.expand(text, [len(pixels) - 1 for pixels in views]), [ProcessedImage(pixels) for pixels in views]

    def image_text(self, crops: int) -> str:
        """The text an image with `crops` pan-and-scan crops takes in the prompt."""
        if not crops:
            return self.image_sequence
        crops_text = " ".join([self.image_sequence] * crops)
        return f"Here is the original image {self.image_sequence} and here are some crops to help you see better {crops_text}"
