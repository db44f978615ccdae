"""LoRA adapters loaded and unloaded while the engine runs (`Engine.load_lora_adapter`,
`unload_lora_adapter`, SGLang's names): an engine started without adapters loads PEFT folders and
generates with them as transformers + peft does; an adapter running or waiting requests use is not
unloaded; a name loaded again with other weights never finds the KV cached under the weights before."""

from __future__ import annotations

import numpy as np
import pytest
import rsgl
from lora_adapters import ADAPTERS, greedy, save_adapter, with_adapter
from tiny_models import build_tiny

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
ONE_TOKEN = {"temperature": 0, "max_new_tokens": 1}


def prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 256, size=length).tolist()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(base folder, transformers model, a folder maker for its adapters)."""
    base_path = tmp_path_factory.mktemp("lora-runtime")
    # A context long enough that a stream outlasts the calls made while it holds its adapter.
    return str(base_path), build_tiny("llama", base_path, max_position_embeddings=8192), tmp_path_factory


@pytest.fixture(scope="module")
def adapters(tiny):
    """{name: (folder, the peft model)}: ADAPTERS a and b, and a2, a's config with other weights."""
    _, base, folders = tiny
    made = {}
    for seed, (name, config) in enumerate([*ADAPTERS.items(), ("a2", ADAPTERS["a"])]):
        folder = folders.mktemp(f"adapter-{name}")
        save_adapter(base, folder, seed, **config)
        made[name] = (str(folder), with_adapter(base, folder))
    return made


def engine_for(base_path: str, **options) -> rsgl.Engine:
    return rsgl.Engine(base_path, dtype="float32", threads=2, max_total_tokens=4096, progress=False, **options)


def test_an_engine_started_without_adapters_loads_them_and_generates_as_peft(tiny, adapters):
    base_path, base, _ = tiny
    ids = prompt(9, 0)
    with engine_for(base_path) as engine:
        assert engine.lora_names == []
        result = engine.load_lora_adapter("a", adapters["a"][0])
        assert result == {"success": True, "error_message": "", "loaded_adapters": {"a": adapters["a"][0]}}
        assert engine.load_lora_adapter("b", adapters["b"][0])["loaded_adapters"] == {"a": adapters["a"][0], "b": adapters["b"][0]}
        assert engine.lora_names == ["a", "b"] and engine.get_server_info()["lora_paths"] == result["loaded_adapters"] | {"b": adapters["b"][0]}
        loras = [None, "a", "b"]
        outs = engine.generate(input_ids=[ids] * 3, sampling_params=GREEDY, lora_path=loras)
    models = {None: base, "a": adapters["a"][1], "b": adapters["b"][1]}
    for lora, out in zip(loras, outs):
        assert out["output_ids"] == greedy(models[lora], ids, GREEDY["max_new_tokens"]), lora
    assert len({tuple(out["output_ids"]) for out in outs}) == 3, "the adapters change the output"


def test_unknown_names_taken_names_and_adapters_that_do_not_fit_are_refused(tiny, adapters):
    base_path, _, _ = tiny
    with engine_for(base_path, max_lora_rank=4) as engine:
        with pytest.raises(rsgl.ModelLoadError, match=r'LoRA adapter "a".*r=8 is over max_lora_rank=4'):
            engine.load_lora_adapter("a", adapters["a"][0])
        with pytest.raises(rsgl.ModelLoadError, match="'nowhere'.*is not a folder"):
            engine.load_lora_adapter("nowhere", "/nonexistent/adapter")
        engine.load_lora_adapter("b", adapters["b"][0])
        with pytest.raises(rsgl.InvalidRequestError, match='LoRA adapter "b" is already loaded; unload it first'):
            engine.load_lora_adapter("b", adapters["b"][0])
        with pytest.raises(rsgl.InvalidRequestError, match=r'LoRA adapter "a" is not loaded; the loaded ones are \["b"\]'):
            engine.unload_lora_adapter("a")
        assert engine.unload_lora_adapter("b") == {"success": True, "error_message": "", "loaded_adapters": {}}
        with pytest.raises(rsgl.InvalidRequestError, match="lora_path 'b'|lora_path \"b\""):
            engine.generate(input_ids=prompt(3, 0), sampling_params=GREEDY, lora_path="b")
        assert engine.lora_names == []
        assert engine.generate(input_ids=prompt(3, 0), sampling_params=GREEDY)["output_ids"]  # still serving


def test_an_adapter_that_requests_use_is_not_unloaded(tiny, adapters):
    base_path, _, _ = tiny
    long = {"temperature": 0, "max_new_tokens": 4000, "ignore_eos": True}
    with engine_for(base_path, lora_paths={"a": adapters["a"][0], "b": adapters["b"][0]}) as engine:
        stream = engine.generate(input_ids=prompt(5, 1), sampling_params=long, lora_path="a", rid="holding-a", stream=True)
        first = next(stream)
        assert first["meta_info"]["finish_reason"] is None
        with pytest.raises(rsgl.InvalidRequestError, match=r'LoRA adapter "a" is in use by 1 request \(running or waiting\)'):
            engine.unload_lora_adapter("a")
        # Another adapter comes and goes meanwhile.
        engine.load_lora_adapter("c", adapters["a2"][0])
        assert engine.unload_lora_adapter("b")["loaded_adapters"] == {"a": adapters["a"][0], "c": adapters["a2"][0]}
        engine.abort_request("holding-a")
        last = list(stream)[-1]
        assert last["meta_info"]["finish_reason"]["type"] == "abort"
        engine.unload_lora_adapter("a")
        assert engine.lora_names == ["c"]


def test_a_name_loaded_again_with_other_weights_never_reads_the_kv_cached_before(tiny, adapters):
    base_path, _, _ = tiny
    ids = prompt(40, 20)  # two whole 16-token pages to share
    with engine_for(base_path) as engine:

        def run(weights: str) -> int:
            out = engine.generate(input_ids=ids, sampling_params=ONE_TOKEN, lora_path="x")
            assert out["output_ids"] == greedy(adapters[weights][1], ids, 1), weights
            return int(out["meta_info"]["cached_tokens"])

        engine.load_lora_adapter("x", adapters["a"][0])
        assert (run("a"), run("a")) == (0, 32)
        engine.unload_lora_adapter("x")
        # a2 has a's name, rank, targets and scaling: only its weights tell it apart.
        engine.load_lora_adapter("x", adapters["a2"][0])
        assert (run("a2"), run("a2")) == (0, 32)
        engine.unload_lora_adapter("x")
        # The same weights under the same name find their KV again.
        engine.load_lora_adapter("x", adapters["a"][0])
        assert run("a") == 32
