"""LoRA adapters (PEFT folders) over tiny random Llama and Qwen3 models: greedy tokens of requests for
the base model and two adapters of different ranks, submitted together in one batch, equal
transformers + peft's for each adapter alone; the prefix cache never serves one adapter's KV to
another; bad adapters and unknown names are refused with errors naming them."""

from __future__ import annotations

import numpy as np
import pytest
import rsgl
from lora_adapters import greedy, save_adapter, save_adapters
from tiny_models import build_tiny

GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
ARCHS = ("llama", "qwen2", "qwen3")  # qwen2: q, k and v have biases


def prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 256, size=length).tolist()


@pytest.fixture(scope="module", params=ARCHS)
def model_with_adapters(request, tmp_path_factory):
    """(base folder, {name: adapter folder}, {None: transformers model, name: the model with that adapter})."""
    base_path = tmp_path_factory.mktemp(f"lora-{request.param}")
    base = build_tiny(request.param, base_path)
    folders, models = save_adapters(base, lambda name: tmp_path_factory.mktemp(f"lora-{request.param}-{name}"))
    return str(base_path), folders, models


def engine_for(base_path: str, folders: dict[str, str], **options) -> rsgl.Engine:
    return rsgl.Engine(base_path, dtype="float32", threads=2, max_total_tokens=2048, progress=False, lora_paths=folders, **options)


@pytest.mark.parametrize("max_loras_per_batch", [8, 1])
def test_base_and_two_adapters_in_one_batch_match_peft(model_with_adapters, max_loras_per_batch):
    base_path, folders, models = model_with_adapters
    # The same prompt under each adapter, and prompts of their own; a list of lora_path names one per prompt.
    shared = prompt(9, 0)
    cases = [(shared, None), (shared, "a"), (shared, "b"), (prompt(5, 1), "b"), (prompt(20, 2), None), (prompt(3, 3), "a")]
    with engine_for(base_path, folders, max_loras_per_batch=max_loras_per_batch) as engine:
        outs = engine.generate(input_ids=[ids for ids, _ in cases], sampling_params=GREEDY, lora_path=[lora for _, lora in cases])
    for (ids, lora), out in zip(cases, outs):
        assert out["output_ids"] == greedy(models[lora], ids, GREEDY["max_new_tokens"]), lora
    # The adapters change what the model says (else this test could not fail).
    assert len({tuple(out["output_ids"]) for out in outs[:3]}) == 3


def test_one_adapter_for_a_whole_batch(model_with_adapters):
    base_path, folders, models = model_with_adapters
    prompts = [prompt(4, 10), prompt(11, 11)]
    with engine_for(base_path, folders) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=GREEDY, lora_path="b")
    assert [out["output_ids"] for out in outs] == [greedy(models["b"], ids, GREEDY["max_new_tokens"]) for ids in prompts]


def test_the_prefix_cache_keeps_each_adapters_kv_apart(model_with_adapters):
    base_path, folders, models = model_with_adapters
    ids = prompt(40, 20)  # two whole 16-token pages to share
    one_token = {"temperature": 0, "max_new_tokens": 1}
    with engine_for(base_path, folders) as engine:

        def cached(lora: str | None) -> int:
            out = engine.generate(input_ids=ids, sampling_params=one_token, lora_path=lora)
            assert out["output_ids"] == greedy(models[lora], ids, 1)
            return int(out["meta_info"]["cached_tokens"])

        assert cached("a") == 0
        assert cached("b") == 0, "adapter b must not read adapter a's KV"
        assert cached(None) == 0, "the base model must not read an adapter's KV"
        assert cached("a") == 32 and cached("b") == 32 and cached(None) == 32


def test_an_unknown_adapter_name_is_refused(model_with_adapters):
    base_path, folders, _ = model_with_adapters
    with engine_for(base_path, folders) as engine:
        with pytest.raises(rsgl.InvalidRequestError, match="'nope'|\"nope\""):
            engine.generate(input_ids=prompt(3, 0), sampling_params=GREEDY, lora_path="nope")
        with pytest.raises(rsgl.InvalidRequestError, match="one name"):
            engine.generate(input_ids=[prompt(3, 0), prompt(4, 0)], sampling_params=GREEDY, lora_path=["a"])
        assert engine.generate(input_ids=prompt(3, 0), sampling_params=GREEDY, lora_path="a")["output_ids"]  # still serving


def test_an_engine_without_adapters_refuses_a_lora_path(model_with_adapters):
    base_path, _, _ = model_with_adapters
    with engine_for(base_path, {}) as engine:
        with pytest.raises(rsgl.InvalidRequestError, match="serves no LoRA adapters"):
            engine.generate(input_ids=prompt(3, 0), sampling_params=GREEDY, lora_path="a")


def test_an_adapter_over_max_lora_rank_is_refused(model_with_adapters):
    base_path, folders, _ = model_with_adapters
    with pytest.raises(rsgl.ModelLoadError, match=r'LoRA adapter "a".*r=8 is over max_lora_rank=4'):
        engine_for(base_path, folders, max_lora_rank=4)


def test_an_adapter_for_another_model_is_refused(model_with_adapters, tmp_path):
    base_path, _, _ = model_with_adapters
    other = build_tiny("llama", tmp_path / "wider", hidden_size=32, intermediate_size=48)
    save_adapter(other, tmp_path / "wider-adapter", 0, r=4, lora_alpha=8, target_modules=["q_proj"])
    with pytest.raises(rsgl.ModelLoadError, match=r'LoRA adapter "wide".*q_proj.*another model'):
        engine_for(base_path, {"wide": str(tmp_path / "wider-adapter")})


def test_an_adapter_of_modules_rsgl_does_not_handle_is_refused(model_with_adapters, tmp_path):
    base_path, _, models = model_with_adapters
    save_adapter(models[None], tmp_path / "head", 0, r=4, lora_alpha=8, target_modules=["q_proj", "lm_head"])
    with pytest.raises(rsgl.ModelLoadError, match=r'LoRA adapter "head".*targets \["lm_head"\]'):
        engine_for(base_path, {"head": str(tmp_path / "head")})


def peft_prompt_logprobs(model, ids: list[int]) -> np.ndarray:
    """The log-probability the transformers (+ peft) `model` gives each token of `ids` after the ones before it."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0].numpy()


def test_over_a_bfloat16_model_adapters_run_in_bfloat16_close_to_peft(model_with_adapters):
    """Adapters are held in the base model's float dtype: over bfloat16 weights, the prompt's
    log-probabilities under each adapter stay within bfloat16's error of peft's float32 ones, far
    closer than the adapter moves them."""
    base_path, folders, models = model_with_adapters
    ids, names = prompt(24, 30), [None, "a", "b"]
    with rsgl.Engine(base_path, dtype="bfloat16", threads=2, max_total_tokens=2048, progress=False, lora_paths=folders) as engine:
        outs = engine.generate(input_ids=[ids] * 3, sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0, lora_path=names)
    base = peft_prompt_logprobs(models[None], ids)
    for out, name in zip(outs, names):
        got = np.array([logprob for logprob, _, _ in out["meta_info"]["input_token_logprobs"][1:]])
        want = peft_prompt_logprobs(models[name], ids)
        assert np.abs(got - want).max() < 0.25, name  # bfloat16's error here: 0.03-0.09
        if name is not None:
            assert np.abs(want - base).max() > 1.0, "the adapters must move the log-probabilities, or this test tells nothing"
