"""SmolVLM from GGUF files as llama.cpp's converter writes them (convert_hf_to_gguf.py, and its --mmproj for the
separate projector file): the language model in f32 with its projector in f32 gives the greedy tokens, with images,
of the Hugging Face folder it came from, and its preprocessing (from the projector's metadata) equals the folder's;
a q8_0 projector (Q8_0 matrices, F16 where rows are not whole blocks) gives the tokens of the folder holding its values
(dequantized by gguf-py); the projector
beside the model is found, several beside it are refused; a missing file, a file that is no projector and a projector
rsgl does not run are refused with typed errors (one found beside the model leaves it running on text); the server
takes --mmproj."""

from __future__ import annotations

import logging
import shutil

import gguf
import numpy as np
import pytest
import rsgl
from gguf_convert import convert_with_projectors, folder_with_projector_values, siglip_name
from PIL import Image
from rsgl.errors import InvalidRequestError, ModelLoadError, UnsupportedModelError
from rsgl.vision.smolvlm import SmolVLMImages
from server_helpers import openai_client, running_server
from vision_models import build_tiny_smolvlm, logprobs, picture
from zoo_models import zoo_tokenizer

NEW_TOKENS = 8
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
PROMPT = "User:<image><image>What is here?<end_of_utterance>\nAssistant:"
PROJECTOR_TYPES = ("f32", "q8_0")


IMAGES = [picture(1, (100, 45)), picture(2, (20, 70))]
OTHER_IMAGES = [picture(3, (100, 45)), picture(2, (20, 70))]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """(Hugging Face folder, the language model's GGUF file alone in its folder, {outtype: projector file})."""
    root = tmp_path_factory.mktemp("smolvlm-gguf")
    folder = root / "hf"
    build_tiny_smolvlm(folder, base_tokenizer=zoo_tokenizer)
    (root / "model").mkdir()
    projectors = {outtype: root / f"mmproj-smolvlm-{outtype}.gguf" for outtype in PROJECTOR_TYPES}
    return folder, *convert_with_projectors(folder, root / "model" / "smolvlm.gguf", projectors)


def greedy(model: str, images: list[Image.Image], **options) -> dict:
    with rsgl.Engine(model, threads=2, progress=False, **options) as engine:
        return engine.generate(PROMPT, GREEDY, image_data=images, return_logprob=True)


def smolvlm_tensor(gguf_name: str, values: np.ndarray) -> tuple[str, np.ndarray]:
    """A SmolVLM projector file's tensor as its Hugging Face folder names and stores it."""
    connector = gguf_name.replace("mm.model.fc.", "model.connector.modality_projection.proj.")
    return siglip_name(gguf_name, "model.vision_model.") or connector, values


def test_f32_files_give_the_hugging_face_folders_tokens_and_preprocessing(converted):
    folder, text_file, projectors = converted
    assert SmolVLMImages.from_projector(projectors["f32"]) == SmolVLMImages.from_folder(folder)
    from_folder = greedy(str(folder), IMAGES)
    from_gguf = greedy(str(text_file), IMAGES, mmproj=str(projectors["f32"]))
    assert (from_gguf["output_ids"], logprobs(from_gguf)) == (from_folder["output_ids"], logprobs(from_folder))
    assert from_gguf["meta_info"]["prompt_tokens"] == from_folder["meta_info"]["prompt_tokens"]
    other = greedy(str(text_file), OTHER_IMAGES, mmproj=str(projectors["f32"]))
    assert other["output_ids"] != from_gguf["output_ids"], "the images must change the tokens"


def test_a_q8_0_projector_reads_as_its_values(converted, tmp_path):
    folder, text_file, projectors = converted
    assert {tensor.tensor_type.name for tensor in gguf.GGUFReader(projectors["q8_0"]).tensors} == {"F32", "F16", "Q8_0"}
    reference = folder_with_projector_values(folder, projectors["q8_0"], tmp_path / "hf", smolvlm_tensor)
    from_gguf, expected = greedy(str(text_file), IMAGES, mmproj=str(projectors["q8_0"])), greedy(str(reference), IMAGES)
    assert (from_gguf["output_ids"], logprobs(from_gguf)) == (expected["output_ids"], logprobs(expected))
    assert logprobs(from_gguf) != logprobs(greedy(str(folder), IMAGES)), "8-bit values must change the logprobs, or this test tells nothing"


def test_the_projector_beside_the_model_is_found_and_several_are_refused(converted, tmp_path):
    folder, text_file, projectors = converted
    shutil.copy(text_file, tmp_path / text_file.name)
    shutil.copy(projectors["f32"], tmp_path / projectors["f32"].name)
    with rsgl.Engine(str(tmp_path), threads=2, progress=False) as engine:
        assert engine.model.mmproj == str(tmp_path / projectors["f32"].name)
        assert engine.generate(PROMPT, GREEDY, image_data=IMAGES)["output_ids"] == greedy(str(folder), IMAGES)["output_ids"]
    shutil.copy(projectors["q8_0"], tmp_path / projectors["q8_0"].name)
    with pytest.raises(ModelLoadError, match="several projector files.*mmproj-smolvlm-f32.gguf, mmproj-smolvlm-q8_0.gguf"):
        rsgl.Engine(str(tmp_path / text_file.name), threads=1, progress=False)


def foreign_projector(path, projector_type: str):
    """A projector file of another model family (`projector_type`, as llama.cpp names them)."""
    writer = gguf.GGUFWriter(path, "clip")
    writer.add_bool("clip.has_vision_encoder", True)
    writer.add_string("clip.projector_type", projector_type)
    writer.add_tensor("v.patch_embd.weight", np.zeros((4, 3, 2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_missing_wrong_and_unsupported_projectors_are_refused(converted, tmp_path, caplog):
    folder, text_file, projectors = converted
    with pytest.raises(ModelLoadError, match="no such projector file"):
        rsgl.Engine(str(text_file), mmproj=str(tmp_path / "mmproj-missing.gguf"), progress=False)
    with pytest.raises(UnsupportedModelError, match="no vision projector"):
        rsgl.Engine(str(text_file), mmproj=str(text_file), progress=False)
    pixtral = foreign_projector(tmp_path / "mmproj-pixtral.gguf", "pixtral")
    with pytest.raises(UnsupportedModelError, match="'pixtral' projector"):
        rsgl.Engine(str(text_file), mmproj=str(pixtral), progress=False)
    with pytest.raises(InvalidRequestError, match="Hugging Face folder"):
        rsgl.Engine(str(folder), mmproj=str(projectors["f32"]), progress=False)
    # Found beside the model, a projector rsgl does not run leaves the model running on text.
    shutil.copy(text_file, tmp_path / text_file.name)
    with caplog.at_level(logging.WARNING), rsgl.Engine(str(tmp_path / text_file.name), threads=1, progress=False) as engine:
        assert engine.model.mmproj is None and engine.model_config["vision"] is None
        with pytest.raises(InvalidRequestError, match="text only"):
            engine.generate(PROMPT, GREEDY, image_data=IMAGES)
    assert "'pixtral' projector" in caplog.text


def test_the_server_takes_mmproj(converted, tmp_path):
    import base64
    import io

    _, text_file, projectors = converted
    png = io.BytesIO()
    IMAGES[0].save(png, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(png.getvalue()).decode()
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What is here?"}]}]
    with running_server(tmp_path, "--model-path", str(text_file), "--mmproj", str(projectors["f32"]), "--threads", "1") as (server, _):
        client = openai_client(server)
        reply = client.chat.completions.create(model="default", messages=messages, temperature=0, max_tokens=NEW_TOKENS, extra_body={"ignore_eos": True})
    with rsgl.Engine(str(text_file), mmproj=str(projectors["f32"]), threads=1, progress=False) as engine:
        chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "What is here?"}]}]
        expected = engine.chat(chat, GREEDY, image_data=[IMAGES[0]])
    assert reply.choices[0].message.content == expected["text"]
    assert reply.usage.prompt_tokens == expected["meta_info"]["prompt_tokens"]
    assert f"with projector {projectors['f32']}" in (tmp_path / "server.log").read_text()
