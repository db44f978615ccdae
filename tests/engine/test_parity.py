"""rsgl against transformers (fp32) on tiny random Llama (untied, and tied with llama3 rope
scaling), Mistral, Qwen2, Qwen3, Mixtral, Qwen2-MoE and Qwen3-MoE models: last-position logits,
prompt log-probabilities, greedy continuations, and the same when prompts of different lengths
share a batch; 16-bit weights against transformers with the same rounded weights; W8A8 against
a torch simulation of it (dense) and batched against alone (MoE)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import rsgl
import torch
from tiny_models import DENSE_ARCHS, MOE_ARCHS, build_tiny, with_weights_rounded

GREEDY = {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}


def prompt(length: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(3, 256, size=length).tolist()


def hf_last_logits(model, ids: list[int]) -> np.ndarray:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, -1].numpy()


def hf_greedy(model, ids: list[int], n: int) -> list[int]:
    """Plain argmax decoding (generate() would also mask EOS, which ignore_eos does not)."""
    seq = list(ids)
    for _ in range(n):
        seq.append(int(hf_last_logits(model, seq).argmax()))
    return seq[len(ids) :]


@pytest.fixture(scope="module", params=DENSE_ARCHS + MOE_ARCHS)
def pair(request, tiny_models):
    path, hf = tiny_models[request.param]
    with rsgl.Engine(path, threads=1, max_total_tokens=2048, progress=False) as engine:
        yield engine, hf


def test_no_tokenizer_means_token_ids_in_and_out(pair):
    engine, _ = pair
    assert engine.tokenizer is None
    out = engine.generate(input_ids=prompt(5, 0), sampling_params={"temperature": 0, "max_new_tokens": 3})
    assert out["text"] == "" and len(out["output_ids"]) == 3
    with pytest.raises(rsgl.InvalidRequestError, match="tokenizer"):
        engine.generate(prompt="hello")


@pytest.mark.parametrize("length", [1, 7, 64])
def test_last_position_logits_match(pair, length):
    engine, hf = pair
    ids = prompt(length, length)
    out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_prompt_logits=True)
    got = np.array(out["meta_info"]["prompt_logits"], dtype=np.float32)
    want = hf_last_logits(hf, ids)
    assert got.shape == want.shape
    assert np.abs(got - want).max() < 1e-3


def test_prompt_logprobs_match(pair):
    engine, hf = pair
    ids = prompt(40, 40)
    with torch.no_grad():
        want = torch.log_softmax(hf(torch.tensor([ids])).logits[0].double(), dim=-1)
    expected = [want[i - 1, ids[i]].item() for i in range(1, len(ids))]
    # From position 0, twice: the second time the prompt is cached, yet every position is scored.
    for _ in range(2):
        out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1}, return_logprob=True, logprob_start_len=0)
        entries = out["meta_info"]["input_token_logprobs"]
        assert entries[0] == (None, ids[0], None) and [e[1] for e in entries] == ids
        assert np.allclose([e[0] for e in entries[1:]], expected, atol=1e-3)
    out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=25)
    assert np.allclose([e[0] for e in out["meta_info"]["input_token_logprobs"]], expected[24:], atol=1e-3)


def test_a_long_prompt_over_many_key_blocks_matches(tmp_path):
    """A prompt of 1,300 tokens: five prefill chunks, six key blocks (256 keys) of 16-token pages,
    each split over the threads when one sequence decodes. Prompt log-probabilities, the last
    position's logits and a greedy continuation equal transformers' (float32 pages)."""
    hf = build_tiny("llama", tmp_path, max_position_embeddings=2048)
    ids = prompt(1300, 13)
    with torch.no_grad():
        logits = hf(torch.tensor([ids])).logits[0].double()
    want = torch.log_softmax(logits, dim=-1)
    expected = [want[i - 1, ids[i]].item() for i in range(1, len(ids))]
    options = {"threads": 2, "chunked_prefill_size": 256, "max_total_tokens": 2048, "kv_cache_dtype": "float32", "progress": False}
    with rsgl.Engine(str(tmp_path), **options) as engine:
        out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0, return_prompt_logits=True)
        assert np.allclose([e[0] for e in out["meta_info"]["input_token_logprobs"][1:]], expected, atol=1e-3)
        assert np.abs(np.array(out["meta_info"]["prompt_logits"]) - logits[-1].numpy()).max() < 1e-3
        greedy = engine.generate(input_ids=ids, sampling_params={**GREEDY, "max_new_tokens": 8})
    assert greedy["output_ids"] == hf_greedy(hf, ids, 8)


@pytest.mark.parametrize("length", [1, 7, 64])
def test_greedy_continuation_matches(pair, length):
    engine, hf = pair
    ids = prompt(length, 100 + length)
    out = engine.generate(input_ids=ids, sampling_params=GREEDY)
    assert out["output_ids"] == hf_greedy(hf, ids, 32)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 32}


def test_batch_of_different_lengths_matches(pair):
    engine, hf = pair
    prompts = [prompt(n, 200 + n) for n in (1, 5, 17, 64)]
    outs = engine.generate(input_ids=prompts, sampling_params={**GREEDY, "max_new_tokens": 0}, return_prompt_logits=True)
    for ids, out in zip(prompts, outs):
        got = np.array(out["meta_info"]["prompt_logits"], dtype=np.float32)
        assert np.abs(got - hf_last_logits(hf, ids)).max() < 1e-3
    outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
    for ids, out in zip(prompts, outs):
        assert out["output_ids"] == hf_greedy(hf, ids, 32)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_16_bit_weights_match_the_rounded_model(tiny_models, arch, dtype):
    path, hf = tiny_models[arch]
    rounded = with_weights_rounded(hf, dtype)
    prompts = [prompt(n, 300 + n) for n in (1, 9, 64)]
    # Float32 pages, so only the weights are rounded (16-bit weights get int8 pages by default).
    with rsgl.Engine(path, dtype=dtype, kv_cache_dtype="float32", threads=2, max_total_tokens=2048, progress=False) as engine:
        assert engine.get_server_info()["dtype"] == dtype
        # Kernels with bf16 dot products also round activations to bf16 (as llama.cpp does to f16).
        rounds_activations = dtype == "bfloat16" and engine.get_server_info()["kernels"] != "avx2"
        alone = []
        for ids in prompts:
            out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_prompt_logits=True)
            got, want = np.array(out["meta_info"]["prompt_logits"], dtype=np.float32), hf_last_logits(rounded, ids)
            tolerance = 3e-2 * np.abs(want).max() if rounds_activations else 1e-3
            assert np.abs(got - want).max() <= tolerance
            alone.append(got)
        engine.flush_cache()
        batched = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 0}, return_prompt_logits=True)
        for one, out in zip(alone, batched):
            assert np.array_equal(one, np.array(out["meta_info"]["prompt_logits"], dtype=np.float32))


def w8a8_reference(model, quantize_lm_head: bool):
    """`model` with rsgl's W8A8 numerics simulated in torch: each linear layer's weights rounded to
    int8 with one scale per output channel, its input rounded to int8 with one scale per token."""

    def to_int8_grid(t: torch.Tensor) -> torch.Tensor:
        scale = t.abs().amax(dim=-1, keepdim=True) / 127
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
        return torch.round(t / scale).clamp(-127, 127) * scale  # half to even, as rsgl

    quantized = copy.deepcopy(model)
    for name, module in quantized.named_modules():
        if isinstance(module, torch.nn.Linear) and (quantize_lm_head or name != "lm_head"):
            module.weight.data = to_int8_grid(module.weight.data)
            module.register_forward_pre_hook(lambda _, args: (to_int8_grid(args[0]),))
    return quantized


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("quantize_lm_head", [False, True])
def test_w8a8_matches_its_torch_simulation(tiny_models, arch, quantize_lm_head):
    path, hf = tiny_models[arch]
    reference = w8a8_reference(hf, quantize_lm_head)
    prompts = [prompt(n, 500 + n) for n in (1, 9, 64)]
    options = {"quantization": "w8a8_int8", "quantize_lm_head": quantize_lm_head, "kv_cache_dtype": "float32"}
    with rsgl.Engine(path, dtype="float32", threads=2, max_total_tokens=2048, progress=False, **options) as engine:
        info = engine.get_server_info()
        assert info["quantization"] == "w8a8_int8", info
        alone = []
        for ids in prompts:
            out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_prompt_logits=True)
            got, want = np.array(out["meta_info"]["prompt_logits"], dtype=np.float32), hf_last_logits(reference, ids)
            # Float sums of int8 products are exact in torch too: only the order the scales are
            # applied in differs (about 1e-7 here, against 3e-2 between W8A8 and plain float).
            assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
            alone.append(got)
        engine.flush_cache()
        batched = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 0}, return_prompt_logits=True)
        for one, out in zip(alone, batched):
            assert np.array_equal(one, np.array(out["meta_info"]["prompt_logits"], dtype=np.float32))


@pytest.mark.parametrize("arch", MOE_ARCHS)
def test_w8a8_moe_stays_close_and_batch_invariant(tiny_models, arch):
    path, hf = tiny_models[arch]
    prompts = [prompt(n, 700 + n) for n in (1, 9, 64)]
    options = {"quantization": "w8a8_int8", "kv_cache_dtype": "float32"}  # only the weights and activations rounded
    with rsgl.Engine(path, dtype="float32", threads=2, max_total_tokens=2048, progress=False, **options) as engine:
        alone = []
        for ids in prompts:
            out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_prompt_logits=True)
            got, want = np.array(out["meta_info"]["prompt_logits"], dtype=np.float32), hf_last_logits(hf, ids)
            # int8 rounding of weights and activations, not a different computation.
            assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()
            alone.append(got)
        engine.flush_cache()
        batched = engine.generate(input_ids=prompts, sampling_params={"max_new_tokens": 0}, return_prompt_logits=True)
        for one, out in zip(alone, batched):
            assert np.array_equal(one, np.array(out["meta_info"]["prompt_logits"], dtype=np.float32))


def test_unknown_quantization_is_refused(tiny_models):
    path, _ = tiny_models["llama"]
    with pytest.raises(rsgl.InvalidRequestError, match="w8a8_int8"):
        rsgl.Engine(path, quantization="awq", progress=False)
