"""Tensor parallelism inside one engine (`tp_size`, `--tp`) on the default model: two ranks give
one rank's greedy tokens, through `rsgl.Engine` and through the server with an `openai` client; a tiny
gpt-oss (per-head attention sinks and biased experts, each rank taking its share) gives transformers' tokens.

Compared with float activations (float32 weights, or the GGUF blocks with 16-bit activations):
with 8-bit activations each rank's partial sums round differently, and the per-block int8
rounding turns those last-bit differences into a different draw of quantization noise (about as
far from float32 as one rank's), so greedy text may part after a few tokens."""

from __future__ import annotations

from pathlib import Path

import httpx
import openai
import pytest
import torch
from rsgl import Engine, InvalidRequestError
from server_helpers import running_server
from zoo_models import build_family

PROMPTS = ["The capital of France is", "Write a haiku about the sea.", "def fibonacci(n):", "List three colors:", "Once upon a time"]
GREEDY = {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}


# Float32 pages: the ranks' partial sums add in another order, and int8 pages can then round a K
# or V element the other way, which near a tie moves a greedy token.
KV = "float32"


def greedy_ids(tp_size: int, **options: object) -> list[list[int]]:
    engine = Engine(threads=2, tp_size=tp_size, random_seed=0, kv_cache_dtype=KV, progress=False, **options)  # type: ignore[arg-type]
    try:
        assert engine.get_server_info()["tp_size"] == tp_size
        results = engine.generate(PROMPTS, GREEDY)
        assert isinstance(results, list)
        return [r["output_ids"] for r in results]
    finally:
        engine.shutdown()


@pytest.mark.parametrize("options", [{"dtype": "float32", "quantization": None}, {"quantization": "gguf", "activation_bits": 16}], ids=["float32", "gguf-a16"])
def test_two_ranks_generate_the_greedy_tokens_of_one(options: dict[str, object]):
    one, two = greedy_ids(1, **options), greedy_ids(2, **options)
    assert all(len(ids) == GREEDY["max_new_tokens"] for ids in one)
    assert one == two


def test_more_ranks_than_kv_heads_is_a_clear_error():
    with pytest.raises(InvalidRequestError, match="tp_size must be between 1 and the model's 3 kv heads"):
        Engine(threads=2, tp_size=4, progress=False)


def test_the_server_with_two_ranks_answers_as_one_rank_does(tmp_path: Path):
    expected = Engine(threads=2, quantization="gguf", activation_bits=16, random_seed=0, kv_cache_dtype=KV, progress=False)
    try:
        texts = [r["text"] for r in expected.generate(PROMPTS[:2], GREEDY)]  # type: ignore[union-attr]
    finally:
        expected.shutdown()
    flags = ("--tp", "2", "--threads", "2", "--quantization", "gguf", "--activation-bits", "16", "--kv-cache-dtype", KV)
    with running_server(tmp_path, *flags, api_key=None) as (url, _):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused")
        for prompt, text in zip(PROMPTS[:2], texts):
            answer = client.completions.create(
                model="default", prompt=prompt, max_tokens=GREEDY["max_new_tokens"], temperature=0, extra_body={"ignore_eos": True}
            )
            assert answer.choices[0].text == text
        assert httpx.get(f"{url}/get_server_info").json()["tp_size"] == 2


def test_two_ranks_split_gpt_oss_sinks_and_experts_as_transformers_runs_them(tmp_path: Path):
    model = build_family("gpt_oss", tmp_path)
    prompts = [[1, *range(3, 14)], [2, *range(40, 61)]]  # past the 8-token window
    with torch.no_grad():
        want = [
            model.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None, pad_token_id=0)[0, len(ids) :].tolist() for ids in prompts
        ]
    with Engine(str(tmp_path), threads=2, tp_size=2, dtype="float32", progress=False) as engine:
        got = engine.generate(input_ids=prompts, sampling_params={"temperature": 0, "max_new_tokens": 8, "ignore_eos": True})
    assert [r["output_ids"] for r in got] == want  # type: ignore[index]
