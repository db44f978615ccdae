"""Images in, on a tiny random SmolVLM and Idefics3 (transformers' own classes, float32): greedy tokens equal to
transformers' for prompts with one and two images, through `Engine.generate(prompt, image_data=...)`; different
images give different tokens; the same image again is read from the prefix cache with the same tokens, a different
one shares only the text before it; requests whose images do not fit are refused."""

from __future__ import annotations

import numpy as np
import pytest
import rsgl
import torch
import transformers
from PIL import Image
from vision_models import build_tiny_smolvlm

NEW_TOKENS = 12
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


def picture(seed: int, size: tuple[int, int]) -> Image.Image:
    """A random RGB picture, smooth enough that resizing keeps it distinct."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(6, 6, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize(size, Image.Resampling.BILINEAR)


def prompt(images: int) -> str:
    return "User:" + "<image>" * images + "What is here?<end_of_utterance>\nAssistant:"


@pytest.fixture(scope="module", params=["smolvlm", "idefics3"])
def tiny_vlm(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = build_tiny_smolvlm(folder, model_type=request.param)
    processor = transformers.AutoProcessor.from_pretrained(folder)
    with rsgl.Engine(str(folder), threads=2, progress=False) as engine:
        yield engine, model, processor


def transformers_greedy(model, processor, text: str, images: list[Image.Image]) -> list[int]:
    inputs = processor(text=text, images=[images], return_tensors="pt")
    ids = inputs["input_ids"][0].tolist()
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            logits = model(input_ids=torch.tensor([ids]), pixel_values=inputs["pixel_values"], pixel_attention_mask=inputs["pixel_attention_mask"]).logits
            ids.append(int(logits[0, -1].argmax()))
    return ids[-NEW_TOKENS:]


@pytest.mark.parametrize("sizes", [[(40, 30)], [(100, 45), (20, 70)]], ids=["one image", "two images"])
def test_greedy_tokens_equal_transformers(tiny_vlm, sizes):
    engine, model, processor = tiny_vlm
    images = [picture(seed, size) for seed, size in enumerate(sizes)]
    text = prompt(len(images))
    result = engine.generate(text, GREEDY, image_data=images)
    assert result["output_ids"] == transformers_greedy(model, processor, text, images)


def test_different_images_give_different_tokens_and_the_same_image_hits_the_cache(tiny_vlm):
    engine, model, processor = tiny_vlm
    engine.flush_cache()
    first, other = picture(10, (64, 64)), picture(11, (64, 64))
    preamble = "Short answers only: what do you see in this one? "
    text = preamble + prompt(1)
    reference = transformers_greedy(model, processor, text, [first]), transformers_greedy(model, processor, text, [other])
    assert reference[0] != reference[1], "the fixture must tell the two pictures apart"
    one = engine.generate(text, GREEDY, image_data=[first])
    again = engine.generate(text, GREEDY, image_data=[first.copy()])
    different = engine.generate(text, GREEDY, image_data=[other])
    assert [one["output_ids"], different["output_ids"]] == list(reference)
    assert again["output_ids"] == one["output_ids"]
    image_token = processor.tokenizer.convert_tokens_to_ids("<image>")
    first_image_token = processor(text=text, images=[[first]])["input_ids"][0].index(image_token)
    assert again["meta_info"]["cached_tokens"] > first_image_token, "the same picture's prompt is read from the prefix cache, its image included"
    # The text before the picture is shared (whole pages of it); nothing from the picture on.
    assert 0 < different["meta_info"]["cached_tokens"] <= first_image_token, "another picture shares the text before it, never its KV"


def test_images_that_do_not_fit_the_prompt_are_refused(tiny_vlm):
    engine, _, _ = tiny_vlm
    image = picture(3, (32, 32))
    with pytest.raises(rsgl.InvalidRequestError, match="placeholder|<image>"):
        engine.generate(prompt(2), GREEDY, image_data=[image])
    with pytest.raises(rsgl.InvalidRequestError, match="image_data"):
        engine.generate(input_ids=[1, 2, 3], sampling_params=GREEDY, image_data=[image])
    with pytest.raises(rsgl.InvalidRequestError, match=r"image_data\[0\]"):
        engine.generate(prompt(1), GREEDY, image_data=[b"not an image"])
    assert engine.generate(prompt(0), GREEDY)["meta_info"]["completion_tokens"] == NEW_TOKENS


def test_a_text_model_refuses_images(tmp_path):
    from tiny_models import build_byte_llama

    build_byte_llama(tmp_path)
    with rsgl.Engine(str(tmp_path), threads=1, progress=False) as engine:
        with pytest.raises(rsgl.InvalidRequestError, match="text only"):
            engine.generate("hi", GREEDY, image_data=[picture(0, (32, 32))])


def test_prompt_chunks_that_cut_through_images_give_the_same_tokens(tiny_vlm):
    """Prefill in chunks of 5 tokens: an image's rows are split over several steps (and encoded once)."""
    engine, model, processor = tiny_vlm
    images = [picture(20, (90, 60)), picture(21, (30, 30))]
    text = prompt(2)
    with rsgl.Engine(engine.model.source, threads=1, chunked_prefill_size=5, progress=False) as chunked:
        result = chunked.generate(text, GREEDY, image_data=images)
    assert result["output_ids"] == transformers_greedy(model, processor, text, images)
