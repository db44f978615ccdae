"""A prompt's images made ready for the engine: each decoded within limits, cut into tiles (or patches) by its model
family's processor, its placeholder in the prompt written out as the model's image tokens, and sent to the core as
float32 pixel values with a hash of the picture (which keys the prefix cache and the image encoder's cache) and, for
Qwen2.5-VL, its patch grid."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from rsgl.core_types import ImageInput
from rsgl.errors import InvalidRequestError
from rsgl.loader import LoadedModel
from rsgl.vision.images import ImageLimits, ImageSource, image_hash, load_image
from rsgl.vision.qwen2_vl import Qwen2VLImageProcessor
from rsgl.vision.smolvlm import SmolVLMImages


def prompt_images_for(model: LoadedModel) -> PromptImages | None:
    """How `model`'s prompts take images; None for a text-only model."""
    vision = model.config.fields["vision"]
    if vision is None:
        return None
    folder = Path(model.source)
    if vision["tower"] == "qwen2_5_vl":
        return PromptImages(Qwen2VLImageProcessor.from_folder(folder))
    return PromptImages(SmolVLMImages.from_folder(folder))


@dataclass
class PromptImages:
    """How a vision-language model's prompts take images (SmolVLM, Idefics3, Qwen2.5-VL)."""

    processor: SmolVLMImages | Qwen2VLImageProcessor
    limits: ImageLimits = field(default_factory=ImageLimits)
    # SmolVLM-256M makes up to 17 tiles of an image (1,088 tokens and 17 vision passes): 16 images fill a 16k context.
    max_images: int = 16

    def prepare(self, text: str, sources: Sequence[ImageSource], part: str) -> tuple[str, list[ImageInput]]:
        """`text` with each image placeholder written out for its image, and the images as the core takes them
        (`part` names the request field in errors, e.g. "image_data")."""
        if len(sources) > self.max_images:
            raise InvalidRequestError(f"{part}: at most {self.max_images} images per prompt; got {len(sources)}")
        images = [load_image(source, part=f"{part}[{i}]", limits=self.limits) for i, source in enumerate(sources)]
        if isinstance(self.processor, Qwen2VLImageProcessor):
            patched = [self.processor.preprocess(image) for image in images]
            text = self.processor.expand(text, [grid for _, grid in patched])
            return text, [
                {"hash": image_hash(image).hex(), "pixel_values": pixels.tobytes(), "grid_thw": list(grid)} for image, (pixels, grid) in zip(images, patched)
            ]
        tiled = [self.processor.preprocess(image) for image in images]
        text = self.processor.expand(text, [(rows, cols) for _, rows, cols in tiled])
        return text, [{"hash": image_hash(image).hex(), "pixel_values": pixels.tobytes()} for image, (pixels, _, _) in zip(images, tiled)]
