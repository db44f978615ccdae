"""rsgl.vision's image preprocessing against transformers' own PIL-backend processors, on generated
images (random noise and gradients; square, landscape, portrait, tiny, large and odd sizes; RGBA,
grayscale and palette images): Qwen2-VL / Qwen2.5-VL's patches and grids, Gemma 3's pixel arrays
(pan and scan too), the expanded prompts tokenized by rsgl's tokenizer against the processors'
input_ids, and the M-RoPE positions against Qwen2.5-VL's get_rope_index on a tiny random model."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from PIL import Image
from rsgl._core import Tokenizer as RsglTokenizer
from rsgl.errors import InvalidRequestError, UnsupportedModelError
from rsgl.vision.gemma3 import Gemma3ImageProcessor
from rsgl.vision.qwen2_vl import Qwen2VLImageProcessor, mrope_positions
from tiny_models import byte_tokenizer
from transformers import (
    Gemma3ImageProcessorPil,
    Gemma3Processor,
    PreTrainedTokenizerFast,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2_5_VLProcessor,
    Qwen2VLImageProcessorPil,
)

# (width, height): square, landscape, portrait, tiny, large, odd. At 19 x 19, Qwen's growth to
# min_pixels lands a float rounding error above 2 patches a side, which transformers rounds up to 3.
SIZES = [(64, 64), (120, 80), (80, 120), (20, 20), (19, 19), (1500, 900), (37, 91)]

# Qwen2.5-VL-3B-Instruct's preprocessor_config.json.
QWEN_3B_CONFIG = {
    "min_pixels": 3136,
    "max_pixels": 12845056,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "merge_size": 2,
    "image_mean": [0.48145466, 0.4578275, 0.40821073],
    "image_std": [0.26862954, 0.26130258, 0.27577711],
    "image_processor_type": "Qwen2VLImageProcessor",
    "processor_class": "Qwen2_5_VLProcessor",
}
# Tight bounds in `size`'s form, so large images shrink and small ones grow.
QWEN_BOUNDED_CONFIG = {"size": {"shortest_edge": 112 * 112, "longest_edge": 28 * 28 * 64}, "image_processor_type": "Qwen2VLImageProcessor"}

# Gemma 3 4B's preprocessor_config.json and processor_config.json.
GEMMA_CONFIG = {
    "do_convert_rgb": None,
    "do_normalize": True,
    "do_pan_and_scan": None,
    "do_rescale": True,
    "do_resize": True,
    "image_mean": [0.5, 0.5, 0.5],
    "image_processor_type": "Gemma3ImageProcessor",
    "image_seq_length": 256,
    "image_std": [0.5, 0.5, 0.5],
    "pan_and_scan_max_num_crops": None,
    "pan_and_scan_min_crop_size": None,
    "pan_and_scan_min_ratio_to_activate": None,
    "processor_class": "Gemma3Processor",
    "resample": 2,
    "rescale_factor": 0.00392156862745098,
    "size": {"height": 896, "width": 896},
}
# The real processor_config.json says 256 too; 16 tells it apart from preprocessor_config.json's and the default.
GEMMA_PROCESSOR_CONFIG = {"image_seq_length": 16, "processor_class": "Gemma3Processor"}

QWEN_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
GEMMA_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}


def random_image(width: int, height: int, seed: int = 0) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8))


def gradient_image(width: int, height: int) -> Image.Image:
    """Smooth ramps (red across, green down, blue diagonal): resampling errors show as a shift."""
    x = np.linspace(0, 255, width)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height)[:, None].repeat(width, 1)
    return Image.fromarray(np.stack([x, y, (x + y) / 2], axis=-1).round().astype(np.uint8))


def other_modes() -> list[Image.Image]:
    """Images that are not RGB: with an alpha channel, grayscale, and a palette without and with a transparent color."""
    rgba = np.random.default_rng(1).integers(0, 256, (50, 70, 4), dtype=np.uint8)
    transparent_palette = random_image(60, 45, seed=3).convert("P")
    transparent_palette.info["transparency"] = 0
    return [Image.fromarray(rgba, "RGBA"), gradient_image(90, 40).convert("L"), random_image(60, 45, seed=2).convert("P"), transparent_palette]


def generated_images() -> list[Image.Image]:
    return [random_image(w, h, seed=i) for i, (w, h) in enumerate(SIZES)] + [gradient_image(w, h) for w, h in SIZES] + other_modes()


IMAGES = generated_images()
IMAGE_IDS = [f"random-{w}x{h}" for w, h in SIZES] + [f"gradient-{w}x{h}" for w, h in SIZES] + ["rgba", "gray", "palette", "palette-transparent"]


def write_folder(path, preprocessor_config, special_tokens, tokenizer_config=None, processor_config=None):
    """A model folder holding the preprocessor config and a byte-level tokenizer with `special_tokens`."""
    (path / "preprocessor_config.json").write_text(json.dumps(preprocessor_config))
    if processor_config is not None:
        (path / "processor_config.json").write_text(json.dumps(processor_config))
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens(special_tokens)
    tokenizer.save(str(path / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", **(tokenizer_config or {})}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def rsgl_tokenizer(folder) -> RsglTokenizer:
    return RsglTokenizer.from_str((folder / "tokenizer.json").read_text())


# Prompts with no, one and two images, `{image}` where each model's placeholder goes, and the images' (width, height).
PROMPTS = [
    ("<|im_start|>user\nhello<|im_end|>\n", []),
    ("<|im_start|>user\n{image}What is this?<|im_end|>\n", [(120, 80)]),
    ("Compare {image} with{image}: which is larger?", [(37, 91), (1500, 900)]),
]
PROMPT_IDS = ["no-image", "one-image", "two-images"]


def prompts_with(placeholder: str) -> list[tuple[str, list[tuple[int, int]]]]:
    return [(text.format(image=placeholder), sizes) for text, sizes in PROMPTS]


def assert_expanded_prompt_equals_processor(folder, reference, processor, text, sizes, expand_argument):
    """`processor` (rsgl's) preprocesses random images of `sizes` and expands `text` for them, giving `processor.expand`
    `expand_argument` of each image's preprocess output; the expanded text's rsgl token ids equal `reference` processor's
    input_ids. Returns the preprocess outputs and `reference`'s."""
    images = [random_image(w, h, seed=i) for i, (w, h) in enumerate(sizes)]
    expected = reference(text=text, images=images or None, return_tensors="np")
    outputs = [processor.preprocess(image) for image in images]
    expanded = processor.expand(text, [expand_argument(output) for output in outputs])
    assert rsgl_tokenizer(folder).encode(expanded) == expected["input_ids"][0].tolist()
    return outputs, expected


# ---- Qwen2-VL / Qwen2.5-VL --------------------------------------------------------------------------


class ImageOnlyQwen2_5_VLProcessor(Qwen2_5_VLProcessor):
    """Qwen2_5_VLProcessor without its video processor (which needs torchvision): images and text only."""

    def __init__(self, image_processor, tokenizer):
        super().__init__(image_processor, tokenizer)


@pytest.fixture(scope="module", params=["qwen2.5-vl-3b", "bounded"])
def qwen_folder(request, tmp_path_factory):
    config = QWEN_3B_CONFIG if request.param == "qwen2.5-vl-3b" else QWEN_BOUNDED_CONFIG
    return write_folder(tmp_path_factory.mktemp("qwen"), config, QWEN_TOKENS)


@pytest.fixture(scope="module")
def qwen_processor(qwen_folder):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(qwen_folder)
    return ImageOnlyQwen2_5_VLProcessor(Qwen2VLImageProcessorPil.from_pretrained(qwen_folder), tokenizer)


@pytest.mark.parametrize("image", IMAGES, ids=IMAGE_IDS)
def test_qwen_pixels_equal_transformers(qwen_folder, image):
    expected = Qwen2VLImageProcessorPil.from_pretrained(qwen_folder)(image, return_tensors="np")
    pixel_values, grid_thw = Qwen2VLImageProcessor.from_folder(qwen_folder).preprocess(image)
    assert grid_thw == tuple(expected["image_grid_thw"][0])
    assert pixel_values.dtype == np.float32
    assert pixel_values.shape == expected["pixel_values"].shape
    assert np.array_equal(pixel_values, expected["pixel_values"])


def test_qwen_bounded_config_shrinks_and_grows(tmp_path):
    """With the bounded config, the large image shrinks and the tiny ones grow (so the comparisons above cover both)."""
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(QWEN_BOUNDED_CONFIG))
    processor = Qwen2VLImageProcessor.from_folder(tmp_path)
    assert (processor.min_pixels, processor.max_pixels) == (112 * 112, 28 * 28 * 64)
    (large_h, large_w), (tiny_h, tiny_w) = processor.resized_size(900, 1500), processor.resized_size(20, 20)
    assert large_h * large_w <= processor.max_pixels < 900 * 1500
    assert tiny_h * tiny_w >= processor.min_pixels > 20 * 20
    assert all(side % 28 == 0 for side in (large_h, large_w, tiny_h, tiny_w))


QWEN_PROMPTS = prompts_with("<|vision_start|><|image_pad|><|vision_end|>")


@pytest.mark.parametrize(("text", "sizes"), QWEN_PROMPTS, ids=PROMPT_IDS)
def test_qwen_expanded_prompt_equals_processor(qwen_folder, qwen_processor, text, sizes):
    processor = Qwen2VLImageProcessor.from_folder(qwen_folder)
    outputs, expected = assert_expanded_prompt_equals_processor(qwen_folder, qwen_processor, processor, text, sizes, lambda output: output[1])
    image_pad = qwen_processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
    assert expected["input_ids"][0].tolist().count(image_pad) == sum(processor.image_token_count(grid) for _, grid in outputs)


def test_qwen_expand_needs_one_placeholder_per_image(qwen_folder):
    processor = Qwen2VLImageProcessor.from_folder(qwen_folder)
    with pytest.raises(InvalidRequestError, match=re.escape("1 <|image_pad|> placeholders for 2 images")):
        processor.expand("<|vision_start|><|image_pad|><|vision_end|>", [(1, 4, 4), (1, 4, 6)])


@pytest.fixture(scope="module")
def tiny_qwen2_5_vl(qwen_processor):
    """A tiny random Qwen2.5-VL whose special token ids are the test tokenizer's."""
    tokenizer = qwen_processor.tokenizer
    ids = {name: tokenizer.convert_tokens_to_ids(token) for name, token in zip(["vision_start", "vision_end", "image", "video"], QWEN_TOKENS)}
    text = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, vocab_size=len(tokenizer))
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}
    vision = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, fullatt_block_indexes=[0])
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=ids["image"],
        video_token_id=ids["video"],
        vision_start_token_id=ids["vision_start"],
        vision_end_token_id=ids["vision_end"],
    )
    torch.manual_seed(0)
    return Qwen2_5_VLForConditionalGeneration(config).eval()


@pytest.mark.parametrize(("text", "sizes"), QWEN_PROMPTS, ids=PROMPT_IDS)
def test_mrope_positions_equal_get_rope_index(qwen_folder, qwen_processor, tiny_qwen2_5_vl, text, sizes):
    images = [gradient_image(w, h) for w, h in sizes]
    inputs = qwen_processor(text=text, images=images or None, return_tensors="pt")
    config = tiny_qwen2_5_vl.config
    expected, expected_delta = tiny_qwen2_5_vl.model.get_rope_index(inputs["input_ids"], inputs["mm_token_type_ids"], inputs.get("image_grid_thw"))
    processor = Qwen2VLImageProcessor.from_folder(qwen_folder)
    grids = [processor.preprocess(image)[1] for image in images]
    positions, delta = mrope_positions(inputs["input_ids"][0].tolist(), config.image_token_id, grids, config.vision_config.spatial_merge_size)
    assert positions.dtype == np.int64
    assert np.array_equal(positions, expected[:, 0].numpy())
    assert delta == expected_delta.item()
    if images:
        assert delta < 0  # the images' positions are fewer than their tokens


def test_mrope_positions_check_the_image_tokens():
    image, text = 9, 5
    with pytest.raises(InvalidRequestError, match="has 3 image tokens, but its 1 images take 4"):
        mrope_positions([text, image, image, image, text], image, [(1, 4, 4)], 2)
    with pytest.raises(InvalidRequestError, match="shorter run"):
        mrope_positions([text, image, image, text, image, image], image, [(1, 4, 4)], 2)


def test_qwen_refuses_configs_it_does_not_follow(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**QWEN_3B_CONFIG, "do_normalize": False}))
    with pytest.raises(UnsupportedModelError, match="do_normalize"):
        Qwen2VLImageProcessor.from_folder(tmp_path)


def test_qwen_skips_steps_set_to_null_as_transformers(tmp_path):
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({**QWEN_3B_CONFIG, "do_normalize": None}))
    image = random_image(64, 64)
    expected = Qwen2VLImageProcessorPil.from_pretrained(tmp_path)(image, return_tensors="np")["pixel_values"]
    assert np.array_equal(Qwen2VLImageProcessor.from_folder(tmp_path).preprocess(image)[0], expected)
    assert expected.min() >= 0  # rescaled, not normalized


def test_qwen_refuses_elongated_images(qwen_folder):
    with pytest.raises(InvalidRequestError, match="too elongated"):
        Qwen2VLImageProcessor.from_folder(qwen_folder).preprocess(random_image(2010, 10))


# ---- Gemma 3 ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gemma_folder(tmp_path_factory):
    return write_folder(
        tmp_path_factory.mktemp("gemma3"), GEMMA_CONFIG, list(GEMMA_TOKENS.values()), {"extra_special_tokens": GEMMA_TOKENS}, GEMMA_PROCESSOR_CONFIG
    )


@pytest.fixture(scope="module")
def gemma_processor(gemma_folder):
    # The PIL backend named: with torchvision installed, transformers would otherwise pick its torch one.
    return Gemma3Processor.from_pretrained(gemma_folder, image_processor=Gemma3ImageProcessorPil.from_pretrained(gemma_folder))


@pytest.mark.parametrize("image", IMAGES, ids=IMAGE_IDS)
def test_gemma_pixels_equal_transformers(gemma_folder, image):
    # Gemma3Processor passes do_convert_rgb=True (the config's is null, which would leave RGBA as four channels).
    expected = Gemma3ImageProcessorPil.from_pretrained(gemma_folder)(image, do_convert_rgb=True, return_tensors="np")["pixel_values"]
    pixel_values = Gemma3ImageProcessor.from_folder(gemma_folder).preprocess(image)
    assert pixel_values.dtype == np.float32
    assert pixel_values.shape == expected.shape == (1, 3, 896, 896)
    assert np.array_equal(pixel_values, expected)


# (width, height) -> pan-and-scan crops: none when square or too small to crop, the last crop cut at the edge (901 / 3).
PAN_AND_SCAN_SIZES = {(1500, 900): 2, (901, 300): 3, (300, 1000): 3, (2400, 300): 4, (64, 64): 0, (37, 91): 0, (500, 450): 0}


@pytest.mark.parametrize(("size", "crops"), PAN_AND_SCAN_SIZES.items(), ids=[f"{w}x{h}" for w, h in PAN_AND_SCAN_SIZES])
def test_gemma_pan_and_scan_equals_processor(gemma_folder, gemma_processor, size, crops):
    image = gradient_image(*size)
    expected = gemma_processor(text="<start_of_image>", images=[image], do_pan_and_scan=True, return_tensors="np")
    processor = Gemma3ImageProcessor.from_folder(gemma_folder, pan_and_scan=True)
    pixel_values = processor.preprocess(image)
    assert len(pixel_values) == 1 + crops
    assert np.array_equal(pixel_values, expected["pixel_values"])
    assert rsgl_tokenizer(gemma_folder).encode(processor.expand("<start_of_image>", [crops])) == expected["input_ids"][0].tolist()


@pytest.mark.parametrize(("text", "sizes"), prompts_with("<start_of_image>"), ids=PROMPT_IDS)
def test_gemma_expanded_prompt_equals_processor(gemma_folder, gemma_processor, text, sizes):
    processor = Gemma3ImageProcessor.from_folder(gemma_folder)
    assert processor.image_seq_length == gemma_processor.image_seq_length == 16
    # Without pan and scan, an image is one view: no crops.
    pixel_values, expected = assert_expanded_prompt_equals_processor(gemma_folder, gemma_processor, processor, text, sizes, lambda views: len(views) - 1)
    if pixel_values:
        assert np.array_equal(np.concatenate(pixel_values), expected["pixel_values"])


def test_gemma_expand_needs_one_placeholder_per_image(gemma_folder):
    with pytest.raises(InvalidRequestError, match="2 <start_of_image> placeholders for 1 images"):
        Gemma3ImageProcessor.from_folder(gemma_folder).expand("<start_of_image><start_of_image>", [0])
