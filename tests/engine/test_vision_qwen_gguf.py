"""Qwen2.5-VL from GGUF files as llama.cpp's converter writes them: the language model (architecture qwen2vl, its M-RoPE
sections in `rope.dimension_sections`) and the separate projector file (projector type qwen2.5vl_merger, the patch
convolution cut into its two frames, q, k and v apart), both f32, give the Hugging Face folder's greedy tokens and
logprobs with no image, one and two images, and its preprocessing (from the projector's metadata); another image changes
the tokens; the language model alone runs on text.

A projector file cannot say the tower's window or the processor's pixel bounds: llama.cpp takes windows of 112 pixels,
rsgl transformers' default bounds. The folder (tests/vision_models.py's tiny Qwen2.5-VL) has those, and images larger
than a window (4 x 4 merged tokens), so windows still cut them."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import rsgl
from gguf_convert import convert_with_projectors
from rsgl.vision.qwen2_vl import DEFAULT_MAX_PIXELS, DEFAULT_MIN_PIXELS, Qwen2VLImageProcessor
from vision_models import build_tiny_qwen2_5_vl, logprobs, picture
from zoo_models import zoo_tokenizer

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
# (width, height): 168 x 140 is 6 x 5 merged tokens (four windows), 200 x 90 is resized to 196 x 84 (7 x 3: two).
SIZES = [(168, 140), (200, 90)]


def prompt(images: int) -> str:
    return "<|im_start|>user\n" + "<|vision_start|><|image_pad|><|vision_end|>" * images + "What is here?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(Hugging Face folder, the language model's GGUF file alone in its folder, the f32 projector file)."""
    root = tmp_path_factory.mktemp("qwen2_5_vl-gguf")
    folder = root / "hf"
    build_tiny_qwen2_5_vl(folder, base_tokenizer=zoo_tokenizer, window_size=112, min_pixels=DEFAULT_MIN_PIXELS, max_pixels=DEFAULT_MAX_PIXELS)
    (root / "model").mkdir()
    text_file, projectors = convert_with_projectors(folder, root / "model" / "qwen2_5_vl.gguf", {"f32": root / "mmproj-qwen2_5_vl-f32.gguf"})
    return folder, text_file, projectors["f32"]


@pytest.fixture(scope="module")
def engines(converted):
    """Engines of the folder and of the GGUF files."""
    folder, text_file, projector = converted
    with rsgl.Engine(str(folder), threads=2, progress=False) as from_folder:
        with rsgl.Engine(str(text_file), mmproj=str(projector), threads=2, progress=False) as from_gguf:
            yield from_folder, from_gguf


def greedy(engine: rsgl.Engine, images: list) -> dict:
    return engine.generate(prompt(len(images)), GREEDY, image_data=images or None, return_logprob=True)


def test_the_projectors_preprocessing_is_the_folders(converted):
    folder, _, projector = converted
    from_projector, from_folder = Qwen2VLImageProcessor.from_projector(projector), Qwen2VLImageProcessor.from_folder(folder)
    # The metadata holds mean and std as float32, which the pixel values are normalized with anyway.
    assert dataclasses.replace(from_projector, pixel_steps=from_folder.pixel_steps) == from_folder
    for seed, size in enumerate(SIZES):
        (pixels, grid), (expected, expected_grid) = from_projector.preprocess(picture(seed, size)), from_folder.preprocess(picture(seed, size))
        assert grid == expected_grid and np.array_equal(pixels, expected)


@pytest.mark.parametrize("images", [0, 1, 2], ids=["no image", "one image", "two images"])
def test_f32_files_give_the_folders_tokens_and_logprobs(engines, images):
    from_folder, from_gguf = engines
    pictures = [picture(seed, size) for seed, size in enumerate(SIZES[:images])]
    expected, result = greedy(from_folder, pictures), greedy(from_gguf, pictures)
    assert (result["output_ids"], logprobs(result)) == (expected["output_ids"], logprobs(expected))
    assert result["meta_info"]["prompt_tokens"] == expected["meta_info"]["prompt_tokens"]


def test_another_image_changes_the_tokens(engines):
    _, from_gguf = engines
    first, other = greedy(from_gguf, [picture(0, SIZES[0])]), greedy(from_gguf, [picture(5, SIZES[0])])
    assert first["output_ids"] != other["output_ids"]


def test_the_language_model_alone_runs_on_text(converted, engines):
    """Without its projector the qwen2vl file is Qwen2 with plain rope: a prompt's three positions are equal."""
    _, text_file, _ = converted
    from_folder, _ = engines
    with rsgl.Engine(str(text_file), threads=2, progress=False) as text_only:
        assert text_only.model.mmproj is None and text_only.model_config["vision"] is None
        result = greedy(text_only, [])
        with pytest.raises(rsgl.InvalidRequestError, match="text only"):
            greedy(text_only, [picture(0, SIZES[0])])
    expected = greedy(from_folder, [])
    assert (result["output_ids"], logprobs(result)) == (expected["output_ids"], logprobs(expected))
