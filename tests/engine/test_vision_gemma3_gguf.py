"""Gemma 3 from GGUF files as llama.cpp's converter writes them (convert_hf_to_gguf.py, and its --mmproj for the
separate projector file, of type gemma3): the language model in f32 with its projector in f32 gives the greedy tokens
and logprobs, with one and two images, of the Hugging Face folder holding the projector's values (the converter keeps
the projection matrix in F16 and stores the projector's norm as the 1 + w it scales by), and its preprocessing (from
the projector's metadata) equals the folder's; other images give other tokens; a q8_0 projector gives the tokens of
the folder holding its values; the projector beside the model is found."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest
import rsgl
from gguf_convert import convert_with_projectors, folder_with_projector_values, siglip_name
from PIL import Image
from rsgl.vision.gemma3 import Gemma3ImageProcessor
from safetensors.numpy import load_file, save_file
from vision_models import build_tiny_gemma3, gemma3_prompt, logprobs, picture
from zoo_models import zoo_tokenizer

NEW_TOKENS = 8
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
PROJECTOR_TYPES = ("f32", "q8_0")
# llama.cpp's Gemma 3 files do not say which layers slide: llama.cpp, and rsgl, take every sixth layer as global, as in
# Gemma 3's checkpoints. The tiny model has six layers to match.
TEXT_LAYERS = dict(num_hidden_layers=6, layer_types=["sliding_attention"] * 5 + ["full_attention"])
# The Hub's Gemma 3 folders name the tower `vision_tower.vision_model.*`, which llama.cpp's converter reads; transformers
# 5 saves it without `vision_model`.
TOWER = "vision_tower.vision_model."
PROJECTOR = {
    "mm.input_projection.weight": "multi_modal_projector.mm_input_projection_weight",
    "mm.soft_emb_norm.weight": "multi_modal_projector.mm_soft_emb_norm.weight",
}

IMAGES = [picture(1, (100, 45)), picture(2, (20, 70))]
OTHER_IMAGES = [picture(3, (100, 45)), picture(4, (20, 70))]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(Hugging Face folder, the language model's GGUF file alone in its folder, {outtype: projector file})."""
    root = tmp_path_factory.mktemp("gemma3-gguf")
    folder = root / "hf"
    build_tiny_gemma3(folder, base_tokenizer=zoo_tokenizer, **TEXT_LAYERS)
    weights = load_file(folder / "model.safetensors")
    hub_names = {name.replace("vision_tower.", TOWER) if not name.startswith(TOWER) else name: values for name, values in weights.items()}
    save_file(hub_names, folder / "model.safetensors", metadata={"format": "pt"})
    (root / "model").mkdir()
    projectors = {outtype: root / f"mmproj-gemma3-{outtype}.gguf" for outtype in PROJECTOR_TYPES}
    return folder, *convert_with_projectors(folder, root / "model" / "gemma3.gguf", projectors)


def gemma3_tensor(gguf_name: str, values: np.ndarray) -> tuple[str, np.ndarray]:
    """A Gemma 3 projector file's tensor as the Hub's folders name and store it (the norm's w, not 1 + w)."""
    if gguf_name == "mm.soft_emb_norm.weight":
        values = values - np.float32(1)
    return siglip_name(gguf_name, TOWER) or PROJECTOR[gguf_name], values


def greedy(model: str, images: list[Image.Image], **options) -> dict:
    with rsgl.Engine(model, threads=2, progress=False, **options) as engine:
        return engine.generate(gemma3_prompt(len(images)), GREEDY, image_data=images, return_logprob=True)


def tokens_and_logprobs(result: dict) -> tuple[list[int], list[float]]:
    return result["output_ids"], logprobs(result)


@pytest.mark.parametrize("images", [IMAGES[:1], IMAGES], ids=["one image", "two images"])
def test_f32_files_give_the_hugging_face_folders_tokens_and_preprocessing(converted, images, tmp_path):
    folder, text_file, projectors = converted
    assert Gemma3ImageProcessor.from_projector(projectors["f32"]) == Gemma3ImageProcessor.from_folder(folder)
    assert {tensor.tensor_type.name for tensor in gguf.GGUFReader(projectors["f32"]).tensors} == {"F32", "F16"}
    reference = folder_with_projector_values(folder, projectors["f32"], tmp_path / "hf", gemma3_tensor)
    from_gguf, expected = greedy(str(text_file), images, mmproj=str(projectors["f32"])), greedy(str(reference), images)
    assert tokens_and_logprobs(from_gguf) == tokens_and_logprobs(expected)
    assert from_gguf["meta_info"]["prompt_tokens"] == expected["meta_info"]["prompt_tokens"]
    other = greedy(str(text_file), OTHER_IMAGES[: len(images)], mmproj=str(projectors["f32"]))
    assert other["output_ids"] != from_gguf["output_ids"], "the images must change the tokens"


def test_a_q8_0_projector_reads_as_its_values(converted, tmp_path):
    folder, text_file, projectors = converted
    assert {tensor.tensor_type.name for tensor in gguf.GGUFReader(projectors["q8_0"]).tensors} == {"F32", "F16", "Q8_0"}
    reference = folder_with_projector_values(folder, projectors["q8_0"], tmp_path / "hf", gemma3_tensor)
    from_gguf, expected = greedy(str(text_file), IMAGES, mmproj=str(projectors["q8_0"])), greedy(str(reference), IMAGES)
    assert tokens_and_logprobs(from_gguf) == tokens_and_logprobs(expected)
    assert tokens_and_logprobs(from_gguf)[1] != tokens_and_logprobs(greedy(str(folder), IMAGES))[1], "8-bit values must change the logprobs"


def test_the_projector_beside_the_model_is_found(converted, tmp_path):
    folder, text_file, projectors = converted
    shutil.copy(text_file, tmp_path / text_file.name)
    shutil.copy(projectors["f32"], tmp_path / projectors["f32"].name)
    with rsgl.Engine(str(tmp_path), threads=2, progress=False) as engine:
        assert engine.model.mmproj == str(tmp_path / projectors["f32"].name)
        assert engine.model_config["vision"]["projector"] == "average_pool"
        found = engine.generate(gemma3_prompt(1), GREEDY, image_data=IMAGES[:1])
    assert found["output_ids"] == greedy(str(text_file), IMAGES[:1], mmproj=str(projectors["f32"]))["output_ids"]
