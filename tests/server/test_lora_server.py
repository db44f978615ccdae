"""LoRA adapters behind a real server (`--lora-paths NAME=PATH ...`): /v1/models lists them, /generate's
`lora_path` and the OpenAI routes' `model` ("NAME" or "BASE:NAME") pick one, and its greedy tokens are
transformers + peft's; an unknown adapter is a 400 on /generate and a 404 on the OpenAI routes."""

from __future__ import annotations

import httpx
import pytest
from lora_adapters import greedy, save_adapters
from server_helpers import AUTH, openai_client, running_server
from tiny_models import build_byte_llama

GREEDY = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
IDS = [1, 72, 101, 108, 108, 111, 33]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """(url, peft models by adapter name) of a server of a tiny byte-level Llama with adapters a and b."""
    base_path = tmp_path_factory.mktemp("lora-base")
    base, _ = build_byte_llama(base_path)
    folders, models = save_adapters(base, lambda name: tmp_path_factory.mktemp(f"lora-{name}"))
    options = ("--model-path", str(base_path), "--dtype", "float32", "--threads", "2", "--max-total-tokens", "1024", "--served-model-name", "tiny")
    lora_paths = ("--lora-paths", *(f"{name}={folder}" for name, folder in folders.items()))
    with running_server(tmp_path_factory.mktemp("lora-server"), *options, *lora_paths) as (url, _):
        yield url, models


def test_models_lists_the_adapters(served):
    url, _ = served
    ids = [model.id for model in openai_client(url).models.list().data]
    assert ids == ["tiny", "a", "b"]


@pytest.mark.parametrize("lora", [None, "a", "b"])
def test_generate_takes_lora_path(served, lora):
    url, models = served
    response = httpx.post(f"{url}/generate", headers=AUTH, json={"input_ids": IDS, "sampling_params": GREEDY, "lora_path": lora}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["output_ids"] == greedy(models[lora], IDS, GREEDY["max_new_tokens"])


@pytest.mark.parametrize(("model", "lora"), [("a", "a"), ("tiny:b", "b"), ("default:a", "a"), ("tiny", None)])
def test_openai_model_names_pick_the_adapter(served, model, lora):
    url, _ = served
    native = httpx.post(f"{url}/generate", headers=AUTH, json={"input_ids": IDS, "sampling_params": GREEDY, "lora_path": lora}, timeout=60).json()
    completion = openai_client(url).completions.create(model=model, prompt=IDS, temperature=0, max_tokens=8, extra_body={"ignore_eos": True})
    assert completion.choices[0].text == native["text"]


def test_an_unknown_adapter_is_refused(served):
    url, _ = served
    response = httpx.post(f"{url}/generate", headers=AUTH, json={"input_ids": IDS, "sampling_params": GREEDY, "lora_path": "nope"}, timeout=60)
    assert response.status_code == 400 and "nope" in response.text
    for model in ("nope", "tiny:nope", "other:a"):
        response = httpx.post(f"{url}/v1/completions", headers=AUTH, json={"model": model, "prompt": IDS, "max_tokens": 1}, timeout=60)
        assert response.status_code == 404, (model, response.text)
