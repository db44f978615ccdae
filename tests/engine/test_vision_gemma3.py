"""Images in, on a tiny random Gemma 3 (transformers' Gemma3ForConditionalGeneration, float32, a sliding-window layer
narrower than an image's tokens): greedy tokens equal to transformers' generate for prompts with no, one and two images,
also when prompt chunks are shorter than an image's tokens (which stay in one chunk) or cut the text around them; the
image tokens attend to each other both ways, which changes the tokens here; different images give different tokens; the
same image again is read from the prefix cache with the same tokens."""

from __future__ import annotations

import pytest
import rsgl
import torch
import transformers
from PIL import Image
from vision_models import GEMMA3_TOKENS_PER_IMAGE, build_tiny_gemma3, check_the_cache_keys_images, gemma3_prompt, picture

NEW_TOKENS = 12
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


@pytest.fixture(scope="module")
def tiny_gemma3(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma3")
    model = build_tiny_gemma3(folder)
    model.generation_config.eos_token_id = None  # as ignore_eos
    # The PIL backend named: with torchvision installed, transformers would otherwise pick its torch one.
    processor = transformers.Gemma3Processor.from_pretrained(folder, image_processor=transformers.Gemma3ImageProcessorPil.from_pretrained(folder))
    with rsgl.Engine(str(folder), threads=2, progress=False) as engine:
        yield engine, model, processor


def transformers_greedy(model, processor, text: str, images: list[Image.Image], bidirectional: bool = True) -> list[int]:
    """transformers' greedy tokens; without `bidirectional`, its image tokens attend causally (no token_type_ids)."""
    inputs = processor(text=text, images=images or None, return_tensors="pt")
    if not bidirectional:
        del inputs["token_type_ids"]
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False)
    return out[0, inputs["input_ids"].shape[1] :].tolist()


def test_the_prompt_takes_each_image_as_transformers_writes_it(tiny_gemma3):
    engine, _, processor = tiny_gemma3
    images = [picture(0, (40, 30)), picture(1, (20, 50))]
    text = gemma3_prompt(2)
    result = engine.generate(text, {**GREEDY, "max_new_tokens": 1}, image_data=images)
    expected = processor(text=text, images=images, return_tensors="np")["input_ids"][0]
    assert result["meta_info"]["prompt_tokens"] == len(expected)
    assert (expected == processor.tokenizer.convert_tokens_to_ids("<image_soft_token>")).sum() == 2 * GEMMA3_TOKENS_PER_IMAGE


@pytest.mark.parametrize("sizes", [[], [(40, 30)], [(100, 45), (20, 70)]], ids=["text only", "one image", "two images"])
def test_greedy_tokens_equal_transformers(tiny_gemma3, sizes):
    engine, model, processor = tiny_gemma3
    images = [picture(seed, size) for seed, size in enumerate(sizes)]
    text = gemma3_prompt(len(images))
    result = engine.generate(text, GREEDY, image_data=images or None)
    assert result["output_ids"] == transformers_greedy(model, processor, text, images)


def test_image_tokens_attend_both_ways(tiny_gemma3):
    """The fixture tells bidirectional image blocks from causal ones: rsgl's tokens are the bidirectional ones."""
    engine, model, processor = tiny_gemma3
    images = [picture(5, (50, 40))]
    text = gemma3_prompt(1)
    both_ways = transformers_greedy(model, processor, text, images)
    assert both_ways != transformers_greedy(model, processor, text, images, bidirectional=False)
    assert engine.generate(text, GREEDY, image_data=images)["output_ids"] == both_ways


# 3 tokens a chunk: fewer than an image's 4, whose chunk grows to hold them; 5: chunks end in the text around images.
@pytest.mark.parametrize("chunk", [3, 5])
def test_prompt_chunks_keep_each_images_tokens_together(tiny_gemma3, chunk):
    engine, model, processor = tiny_gemma3
    images = [picture(20, (90, 60)), picture(21, (30, 30))]
    text = gemma3_prompt(2)
    with rsgl.Engine(engine.model.source, threads=1, chunked_prefill_size=chunk, progress=False) as chunked:
        result = chunked.generate(text, GREEDY, image_data=images)
    assert result["output_ids"] == transformers_greedy(model, processor, text, images)


def test_different_images_give_different_tokens_and_the_same_image_hits_the_cache(tiny_gemma3):
    engine, model, processor = tiny_gemma3
    text = gemma3_prompt(1)
    first_image_token = processor(text=text, images=[[picture(0, (64, 64))]])["input_ids"][0].index(model.config.image_token_id)
    check_the_cache_keys_images(engine, lambda images: transformers_greedy(model, processor, text, images), text, GREEDY, first_image_token)


def test_a_cached_prefix_ending_inside_an_image_gives_the_same_tokens(tiny_gemma3):
    """Pages of 13 tokens: a second prompt with the same image and other text after it reads the first one's pages up to
    a boundary inside the image's tokens, and the chunk computing the rest of them starts there (its queries still see
    all of them)."""
    engine, model, processor = tiny_gemma3
    images = [picture(30, (40, 40))]
    first_text, second_text = gemma3_prompt(1), gemma3_prompt(1).replace("What is here?", "Which one?")
    ids = processor(text=first_text, images=images, return_tensors="np")["input_ids"][0].tolist()
    image_token = processor.tokenizer.convert_tokens_to_ids("<image_soft_token>")
    run = [p for p, token in enumerate(ids) if token == image_token]
    assert run[0] < 26 <= run[-1], "a page boundary falls inside the image's tokens"
    with rsgl.Engine(engine.model.source, threads=1, page_size=13, progress=False) as paged:
        first = paged.generate(first_text, GREEDY, image_data=images)
        second = paged.generate(second_text, GREEDY, image_data=images)
    assert second["meta_info"]["cached_tokens"] == 26
    assert first["output_ids"] == transformers_greedy(model, processor, first_text, images)
    assert second["output_ids"] == transformers_greedy(model, processor, second_text, images)
