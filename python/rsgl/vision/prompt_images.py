"""A prompt's images made ready for the engine: each decoded within limits, cut into tiles (or patches) by its model
family's processor (SmolVLM's, Gemma 3's, Qwen2-VL's), its placeholder in the prompt written out as the model's image
tokens, and sent to the core as float32 pixel values with a hash of the picture (which keys the prefix cache and the
image encoder's cache) and, for Qwen2.5-VL, its patch grid."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from PIL import Image

from rsgl._core import WeightStore
from rsgl.core_types import ImageInput
from rsgl.errors import InvalidRequestError
from rsgl.loader import LoadedModel
from rsgl.vision.gemma3 import Gemma3ImageProcessor
from rsgl.vision.images import ImageLimits, ImageSource, image_hash, load_image
from rsgl.vision.pixels import ProcessedImage
from rsgl.vision.qwen2_vl import Qwen2VLImageProcessor
from rsgl.vision.smolvlm import SmolVLMImages


class ImageProcessor(Protocol):
    """A model family's image preprocessing and prompt expansion."""

    def expand_images(self, text: str, images: Sequence[Image.Image]) -> tuple[str, list[ProcessedImage]]:
        """`text` with each image placeholder written out for its image, and each image as its tower takes it."""
        ...


# The preprocessing of each type of projector file rsgl reads (llama.cpp's `clip.projector_type`), from its metadata.
PROJECTOR_PROCESSORS: dict[str, Callable[[str], ImageProcessor]] = {
    "idefics3": SmolVLMImages.from_projector,
    "gemma3": Gemma3ImageProcessor.from_projector,
    "qwen2.5vl_merger": Qwen2VLImageProcessor.from_projector,
}


def prompt_images_for(model: LoadedModel) -> PromptImages | None:
    """How `model`'s prompts take images; None for a text-only model. A GGUF model's projector file names its type;
    a folder's tower and projector name the family: SmolVLM's and Idefics3's pixel shuffle, Gemma 3's average pool,
    Qwen2.5-VL's own tower."""
    vision = model.config.fields["vision"]
    if vision is None:
        return None
    if model.mmproj is not None:  # the core read its config, so its type is one of PROJECTOR_PROCESSORS
        projector_type = WeightStore.gguf_metadata(model.mmproj)["clip.projector_type"]
        return PromptImages(PROJECTOR_PROCESSORS[projector_type](model.mmproj))
    folder = Path(model.source)
    if vision["tower"] == "qwen2_5_vl":
        return PromptImages(Qwen2VLImageProcessor.from_folder(folder))
    processor: ImageProcessor = Gemma3ImageProcessor.from_folder(folder) if vision["projector"] == "average_pool" else SmolVLMImages.from_folder(folder)
    return PromptImages(processor)


@dataclass
class PromptImages:
    """How a vision-language model's prompts take images (SmolVLM, Idefics3, Gemma 3, Qwen2.5-VL)."""

    processor: ImageProcessor
    limits: ImageLimits = field(default_factory=ImageLimits)
    # SmolVLM-256M makes up to 17 tiles of an image (1,088 tokens and 17 vision passes): 16 images fill a 16k context.
    max_images: int = 16

    def prepare(self, text: str, sources: Sequence[ImageSource], part: str) -> tuple[str, list[ImageInput]]:
        """`text` with each image placeholder written out for its image, and the images as the core takes them
        (`part` names the request field in errors, e.g. "image_data")."""
        if len(sources) > self.max_images:
            raise InvalidRequestError(f"{part}: at most {self.max_images} images per prompt; got {len(sources)}")
        images = [load_image(source, part=f"{part}[{i}]", limits=self.limits) for i, source in enumerate(sources)]
        text, processed = self.processor.expand_images(text, images)
        return text, [image_input(image_hash(image).hex(), pixels) for image, pixels in zip(images, processed)]


def image_input(hash_hex: str, image: ProcessedImage) -> ImageInput:
    """An image as the core takes it: its pixel values' bytes, keyed by `hash_hex`, with its patch grid if it has one."""
    core: ImageInput = {"hash": hash_hex, "pixel_values": image.pixels.tobytes()}
    if image.grid_thw is not None:
        core["grid_thw"] = list(image.grid_thw)
    return core
