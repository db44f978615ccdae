"""Images in, on a tiny random SmolVLM and Idefics3 (transformers' own classes, float32): greedy tokens equal to
transformers' for prompts with one and two images, through `Engine.generate(prompt, image_data=...)`; different
images give different tokens; the same image again is read from the prefix cache with the same tokens, a different
one shares only the text before it; requests whose images do not fit are refused."""

from __future__ import annotations

import pytest
import rsgl
import torch
import transformers
from PIL import Image
from vision_models import build_tiny_smolvlm, check_the_cache_keys_images, picture

NEW_TOKENS = 12
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


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
    # Text before the picture long enough for whole pages of it to be shared whatever the picture.
    text = "Short answers only: what do you see in this one? " + prompt(1)
    first_image_token = processor(text=text, images=[[picture(0, (64, 64))]])["input_ids"][0].index(processor.tokenizer.convert_tokens_to_ids("<image>"))
    shared = check_the_cache_keys_images(engine, lambda images: transformers_greedy(model, processor, text, images), text, GREEDY, first_image_token)
    assert shared > 0, "the text before another picture is read from the cache"


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
