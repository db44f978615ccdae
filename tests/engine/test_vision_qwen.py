"""Images in, on a tiny random Qwen2.5-VL (transformers' own class, float32, weights of std 0.2 and 0.3; a vision tower whose
56-pixel windows cut the images into several, with one full-attention block between windowed ones): greedy tokens equal
to transformers' generate for prompts with no image, one and two images, also with prefill chunks that cut through an
image (M-RoPE's 3D positions per chunk, and the rope delta while decoding); different images give different tokens; the
same image again is read from the prefix cache with the same tokens."""

from __future__ import annotations

import pytest
import rsgl
import torch
from PIL import Image
from transformers import PreTrainedTokenizerFast, Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil
from vision_models import build_tiny_qwen2_5_vl, check_the_cache_keys_images, picture

NEW_TOKENS = 10
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


class ImageOnlyProcessor(Qwen2_5_VLProcessor):
    """Qwen2_5_VLProcessor without its video processor (which needs torchvision): images and text only."""

    def __init__(self, image_processor, tokenizer):
        super().__init__(image_processor, tokenizer)


def prompt(images: int) -> str:
    return "<|im_start|>user\n" + "<|vision_start|><|image_pad|><|vision_end|>" * images + "What is here?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tiny_qwen(tmp_path_factory):
    folder = tmp_path_factory.mktemp("qwen2_5_vl")
    model = build_tiny_qwen2_5_vl(folder)
    processor = ImageOnlyProcessor(Qwen2VLImageProcessorPil.from_pretrained(folder), PreTrainedTokenizerFast.from_pretrained(folder))
    with rsgl.Engine(str(folder), threads=2, progress=False) as engine:
        yield engine, model, processor


def transformers_greedy(model, processor, text: str, images: list[Image.Image]) -> list[int]:
    inputs = processor(text=text, images=images or None, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


# (width, height): 112 x 84 is 6 x 8 patches (3 x 4 tokens: four windows); 112 x 112 is 4 x 4 tokens (four windows);
# 150 x 100 is shrunk to 112 x 84. With these pictures transformers' tokens change when the tower attends without windows,
# or the image tokens' positions are 1D ones.
@pytest.mark.parametrize("sizes", [[], [(112, 84)], [(112, 112), (150, 100)]], ids=["no image", "one image", "two images"])
def test_greedy_tokens_equal_transformers(tiny_qwen, sizes):
    engine, model, processor = tiny_qwen
    images = [picture(seed, size) for seed, size in enumerate(sizes)]
    text = prompt(len(images))
    result = engine.generate(text, GREEDY, image_data=images or None)
    assert result["output_ids"] == transformers_greedy(model, processor, text, images)


def test_different_images_give_different_tokens_and_the_same_image_hits_the_cache(tiny_qwen):
    engine, model, processor = tiny_qwen
    text = prompt(1)
    first_image_token = processor(text=text, images=[picture(0, (112, 84))])["input_ids"][0].index(model.config.image_token_id)
    check_the_cache_keys_images(engine, lambda images: transformers_greedy(model, processor, text, images), text, GREEDY, first_image_token, size=(112, 84))


def test_prompt_chunks_that_cut_through_images_give_the_same_tokens(tiny_qwen):
    """Prefill in chunks of 5 tokens: images' rows and 3D positions are split over several steps."""
    engine, model, processor = tiny_qwen
    images = [picture(20, (84, 112)), picture(21, (56, 56))]
    text = prompt(2)
    with rsgl.Engine(engine.model.source, threads=1, chunked_prefill_size=5, progress=False) as chunked:
        result = chunked.generate(text, GREEDY, image_data=images)
    assert result["output_ids"] == transformers_greedy(model, processor, text, images)


def test_images_that_do_not_fit_the_prompt_are_refused(tiny_qwen):
    engine, _, _ = tiny_qwen
    with pytest.raises(rsgl.InvalidRequestError, match="placeholders"):
        engine.generate(prompt(2), GREEDY, image_data=[picture(3, (56, 56))])
