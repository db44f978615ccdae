"""The pixel steps the image processors share, done as transformers' PIL backend does them so the
numbers come out identical: resizing with Pillow on the 8-bit RGB image (`rsgl.vision.images.to_rgb`'s),
then rescaling (in float64, stored as float32) and normalizing per channel (in float32)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from PIL import Image

from rsgl._typing import JsonObject
from rsgl.errors import UnsupportedModelError
from rsgl.loader import read_json_object

# Arrays of one image's (or its crops') values: [channels, height, width] or patches.
FloatPixels = npt.NDArray[np.float32]
PerChannel = tuple[float, float, float]


@dataclass
class ProcessedImage:
    """One image as a model's vision tower takes it: its pixel values (tiles or patches) and, for Qwen2-VL's tower,
    its patch grid (frames, rows, columns)."""

    pixels: FloatPixels
    grid_thw: tuple[int, int, int] | None = None


# Preprocessing steps Qwen2-VL's and Gemma 3's processors always run; a config turning one off is refused.
ALWAYS_ON_STEPS = ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb")


def preprocessor_config(folder: Path) -> JsonObject:
    """`folder`'s preprocessor_config.json. Raises UnsupportedModelError if it turns off a step
    rsgl always runs (the released checkpoints leave them on, or unset)."""
    path = folder / "preprocessor_config.json"
    config = read_json_object(path)
    disabled = [step for step in ALWAYS_ON_STEPS if config.get(step) is False]
    if disabled:
        steps = ", ".join(disabled)
        raise UnsupportedModelError(f"{path} sets {steps} to false; rsgl's image preprocessing always converts to RGB, resizes, rescales and normalizes")
    return config


@dataclass(frozen=True)
class PixelSteps:
    """What a processor does to an RGB image: resizes it with Pillow's `resample` filter, then
    multiplies each value by `rescale_factor` and normalizes it per channel, (x - mean) / std.
    A None factor, or None mean and std, skips that step."""

    resample: Image.Resampling
    rescale_factor: float | None
    mean: PerChannel | None
    std: PerChannel | None

    @classmethod
    def from_config(cls, config: JsonObject, resample: Image.Resampling, mean: float | Sequence[float], std: float | Sequence[float]) -> PixelSteps:
        """An image processor config's steps (`resample` as Pillow's integer code, `do_rescale`,
        `rescale_factor`, `do_normalize`, `image_mean`, `image_std`, each mean and std one value or
        one per channel); a key it leaves out or sets to null takes the given default (1/255 for
        the factor). Raises ValueError or TypeError for values that are none of these."""
        code = config.get("resample")
        normalize = config.get("do_normalize", True)
        return cls(
            resample=resample if code is None else Image.Resampling(code),
            rescale_factor=float(_or_default(config, "rescale_factor", 1 / 255)) if config.get("do_rescale", True) else None,
            mean=_per_channel(_or_default(config, "image_mean", mean)) if normalize else None,
            std=_per_channel(_or_default(config, "image_std", std)) if normalize else None,
        )

    def resized(self, image: Image.Image, height: int, width: int) -> Image.Image:
        """An RGB image resized to `height` x `width` by Pillow, still 8-bit RGB."""
        return image.resize((width, height), resample=self.resample)

    def values(self, pixels: npt.NDArray[np.uint8]) -> FloatPixels:
        """[..., height, width, channels] bytes to C-contiguous [..., channels, height, width]
        float32 values, (pixel * rescale_factor - mean) / std. The product is taken in float64 and
        rounded to float32 before the float32 subtraction and division, as transformers does."""
        channels_first = np.ascontiguousarray(np.moveaxis(pixels, -1, -3))
        if self.rescale_factor is None:
            values = channels_first.astype(np.float32)
        else:
            values = (channels_first.astype(np.float64) * self.rescale_factor).astype(np.float32)
        if self.mean is None or self.std is None:
            return values
        mean = np.asarray(self.mean, dtype=np.float32).reshape(-1, 1, 1)
        std = np.asarray(self.std, dtype=np.float32).reshape(-1, 1, 1)
        normalized: FloatPixels = (values - mean) / std
        return normalized


def _or_default(config: JsonObject, key: str, default: Any) -> Any:
    value = config.get(key)
    return default if value is None else value


def _per_channel(value: float | Sequence[float]) -> PerChannel:
    """One value for every channel, or a value per channel, as three floats."""
    red, green, blue = [float(value)] * 3 if isinstance(value, int | float) else [float(channel) for channel in value]
    return red, green, blue
