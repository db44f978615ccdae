"""The pixel steps the image processors share, done as transformers' PIL backend does them so the
numbers come out identical: RGB conversion, resizing with Pillow on the 8-bit image, then
rescaling (in float64, stored as float32) and normalizing per channel (in float32)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from PIL import Image

from rsgl._typing import JsonObject
from rsgl.errors import ModelLoadError, UnsupportedModelError

# Arrays of one image's (or its crops') values: [channels, height, width] or patches.
FloatPixels = npt.NDArray[np.float32]

# Preprocessing steps the processors always run; a config turning one off is refused.
ALWAYS_ON_STEPS = ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb")


def read_json(path: Path) -> JsonObject:
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise ModelLoadError(f"cannot read {path}: {error}") from error
    if not isinstance(config, dict):
        raise ModelLoadError(f"{path} is not a JSON object")
    return config


def refuse_disabled_steps(config: JsonObject, path: Path) -> None:
    """Raises UnsupportedModelError if the preprocessor config turns off a step rsgl always runs
    (the released checkpoints leave them on, or unset)."""
    disabled = [step for step in ALWAYS_ON_STEPS if config.get(step) is False]
    if disabled:
        steps = ", ".join(disabled)
        raise UnsupportedModelError(f"{path} sets {steps} to false; rsgl's image preprocessing always converts to RGB, resizes, rescales and normalizes")


def resampling(config: JsonObject, default: Image.Resampling) -> Image.Resampling:
    """The Pillow filter a config's `resample` (Pillow's integer code) names."""
    code = config.get("resample")
    return default if code is None else Image.Resampling(code)


def to_rgb(image: Image.Image) -> Image.Image:
    """The image in RGB; transparent pixels are laid over white first (not left as their RGB values)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(white, rgba).convert("RGB")
    return image.convert("RGB")


def resized_pixels(image: Image.Image, height: int, width: int, resample: Image.Resampling) -> npt.NDArray[np.uint8]:
    """An RGB image resized to `height` x `width` by Pillow, as [height, width, 3] bytes."""
    return np.asarray(image.resize((width, height), resample=resample), dtype=np.uint8)


def normalized(pixels: npt.NDArray[np.uint8], rescale_factor: float, mean: Sequence[float], std: Sequence[float]) -> FloatPixels:
    """[height, width, channels] bytes to [channels, height, width] float32 values,
    (pixel * rescale_factor - mean) / std. The product is taken in float64 and rounded to float32
    before the float32 subtraction and division, as transformers does."""
    channels_first = pixels.transpose(2, 0, 1)
    rescaled = (channels_first.astype(np.float64) * rescale_factor).astype(np.float32)
    channel_mean = np.asarray(mean, dtype=np.float32).reshape(-1, 1, 1)
    channel_std = np.asarray(std, dtype=np.float32).reshape(-1, 1, 1)
    result: FloatPixels = (rescaled - channel_mean) / channel_std
    return result
