"""LoRA adapters with tensor parallelism (tp_size 2): each rank holds its slice of every update, cut as its shard of the
base weights is (B's rows of its q, k and v heads and of its MLP columns; A's columns of its o and down inputs, whose
updates join the ranks' partial sums before the reduction). Over a tiny random Llama (4 q heads over 2 kv heads: one
kv head and its query group per rank; MLP columns split 64 + 32) and Phi-3 (fused qkv_proj and gate_up_proj), the
greedy tokens of base, rank-8 and rank-4 rsLoRA requests in one float32 batch equal transformers + peft's for each
adapter alone, and one rank's; adapters load and unload at run time on two ranks."""

from __future__ import annotations

import numpy as np
import pytest
import rsgl
from lora_adapters import ADAPTERS, greedy, save_adapter, with_adapter
from tiny_models import build_tiny
from zoo_models import build_family

GREEDY = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}

# Per family: its builder, and adapter a's and b's configs (b's with rsLoRA's scaling).
FAMILIES = {
    "llama": (lambda path: build_tiny("llama", path), ADAPTERS["a"], ADAPTERS["b"]),
    "phi3": (
        lambda path: build_family("phi3", path),
        dict(r=8, lora_alpha=16, target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]),
        dict(r=4, lora_alpha=6, use_rslora=True, target_modules=["qkv_proj", "down_proj"]),
    ),
}


def prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 256, size=length).tolist()


@pytest.fixture(scope="module", params=list(FAMILIES))
def model_with_adapters(request, tmp_path_factory):
    """(base folder, {name: adapter folder}, {None: transformers model, name: the model with that adapter})."""
    build, *configs = FAMILIES[request.param]
    base_path = tmp_path_factory.mktemp(f"lora-tp-{request.param}")
    base = build(base_path)
    folders, models = {}, {None: base}
    for seed, (name, config) in enumerate(zip("ab", configs)):
        folder = tmp_path_factory.mktemp(f"lora-tp-{request.param}-{name}")
        save_adapter(base, folder, seed, **config)
        folders[name], models[name] = str(folder), with_adapter(base, folder)
    return str(base_path), folders, models


def engine_for(base_path: str, tp_size: int, **options) -> rsgl.Engine:
    return rsgl.Engine(base_path, dtype="float32", threads=2, tp_size=tp_size, max_total_tokens=2048, progress=False, **options)


def test_base_and_two_adapters_in_one_batch_on_two_ranks_match_peft_and_one_rank(model_with_adapters):
    base_path, folders, models = model_with_adapters
    shared = prompt(9, 0)
    cases = [(shared, None), (shared, "a"), (shared, "b"), (prompt(5, 1), "b"), (prompt(14, 2), None), (prompt(3, 3), "a")]
    outputs = {}
    for tp_size in (2, 1):
        with engine_for(base_path, tp_size, lora_paths=folders) as engine:
            assert engine.get_server_info()["tp_size"] == tp_size
            outs = engine.generate(input_ids=[ids for ids, _ in cases], sampling_params=GREEDY, lora_path=[lora for _, lora in cases])
        outputs[tp_size] = [out["output_ids"] for out in outs]
    for (ids, lora), out in zip(cases, outputs[2]):
        assert out == greedy(models[lora], ids, GREEDY["max_new_tokens"]), lora
    assert outputs[2] == outputs[1]
    # The adapters change what the model says (else this test could not fail).
    assert len({tuple(out) for out in outputs[2][:3]}) == 3


def test_adapters_load_and_unload_at_run_time_on_two_ranks(model_with_adapters):
    base_path, folders, models = model_with_adapters
    ids, loras = prompt(11, 4), [None, "a", "b"]
    with engine_for(base_path, 2) as engine:
        for name in ("a", "b"):
            assert engine.load_lora_adapter(name, folders[name])["success"]
        outs = engine.generate(input_ids=[ids] * 3, sampling_params=GREEDY, lora_path=loras)
        assert [out["output_ids"] for out in outs] == [greedy(models[lora], ids, GREEDY["max_new_tokens"]) for lora in loras]
        assert engine.unload_lora_adapter("a")["loaded_adapters"] == {"b": folders["b"]}
        with pytest.raises(rsgl.InvalidRequestError, match="lora_path 'a'|lora_path \"a\""):
            engine.generate(input_ids=ids, sampling_params=GREEDY, lora_path="a")
        engine.load_lora_adapter("a", folders["a"])
        assert engine.generate(input_ids=ids, sampling_params=GREEDY, lora_path="a")["output_ids"] == outs[1]["output_ids"]
