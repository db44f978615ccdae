"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) against transformers loading the same
file (same dequantized weights, fp32): greedy tokens must be identical in float32; in bfloat16
the argmax must agree at nearly every teacher-forced step; and the server started with no options
(the weights requantized to W8A8) answers the first questions a new user asks right."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import rsgl
import torch
from rsgl.loader.default_model import default_model_path
from server_helpers import openai_client, running_server
from test_engine import KV_DTYPES

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is the boiling point of water?<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def hf_model():
    from transformers import AutoModelForCausalLM

    path = default_model_path()
    return AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def llm():
    # float32 pages: parity with transformers measures the weights' numerics (int8 pages have their own tests)
    with rsgl.Engine(threads=2, dtype="float32", kv_cache_dtype="float32", progress=False) as engine:
        yield engine


def hf_greedy(hf_model, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids) :].tolist()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_32_tokens_match_transformers(prompt, llm, hf_model):
    ids = llm.tokenize(prompt)
    got = llm.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 32, "ignore_eos": True})
    want = hf_greedy(hf_model, ids)
    assert len(want) == 32
    assert got["output_ids"] == want


def test_bfloat16_follows_transformers(hf_model):
    with rsgl.Engine(threads=2, dtype="bfloat16", progress=False) as engine:
        assert (engine.get_server_info()["dtype"], engine.get_server_info()["quantization"]) == ("bfloat16", None)
        agree = total = 0
        for prompt in PROMPTS:
            ids = engine.tokenize(prompt)
            want = hf_greedy(hf_model, ids)
            # Teacher-forced: the bf16 argmax after each prefix of transformers' continuation.
            for step, token in enumerate(want):
                out = engine.generate(input_ids=ids + want[:step], sampling_params={"max_new_tokens": 0}, return_prompt_logits=True)
                agree += int(np.argmax(out["meta_info"]["prompt_logits"]) == token)
                total += 1
        assert agree >= 0.9 * total, f"bf16 argmax agreed at {agree} of {total} steps"
        chat = engine.apply_chat_template([{"role": "user", "content": "What are the three primary colors?"}])
        answer = engine.generate(chat, {"temperature": 0, "max_new_tokens": 16})["text"]
        assert "Red" in answer and "Blue" in answer and "Yellow" in answer


def test_sixteen_bit_activations_keep_the_stored_4_bits_near_float(hf_model):
    """The file's Q4_1 blocks as stored: with `activation_bits=16` the logits follow transformers'
    float32 run of the same dequantized weights, far closer than int8 activations do, and a
    greedy answer int8 activations lose (llama.cpp too; benches/factual_questions.py) is right."""
    errors = {}
    for bits in (8, 16):
        with rsgl.Engine(threads=2, quantization="gguf", activation_bits=bits, kv_cache_dtype="float32", progress=False) as engine:
            info = engine.get_server_info()
            assert (info["quantization"], info["activation_bits"]) == ("gguf", bits)
            ids = engine.tokenize(engine.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}]))
            with torch.no_grad():
                want = hf_model(torch.tensor([ids])).logits[0, -1].numpy()
            got = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_prompt_logits=True)["meta_info"]["prompt_logits"]
            errors[bits] = float(np.abs(np.asarray(got) - want).max())
            answer = engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 8})["text"]
    assert errors[16] < 0.05 and errors[16] < errors[8] / 20, errors
    assert "Paris" in answer


@pytest.mark.parametrize("weights", [{"dtype": "float32"}], ids=["float32"])
def test_int8_kv_pages_score_a_text_like_float32_pages(weights):
    """int8 pages against float32 pages on this model's real weights dequantized to float32: a
    text's prompt log-probabilities within the bounds tests/engine/test_engine.py's KV test holds the tiny
    model to. Not its Q4_1 blocks as stored: there int8 pages miss those bounds (max 0.367, mean
    0.071 measured; docs/performance.md), so 4-bit weights keep float32 pages by default."""
    _, max_diff, mean_diff = KV_DTYPES["int8"]
    text = (Path(__file__).parents[1] / "data" / "lighthouse_keepers.txt").read_text()
    logprobs = {}
    for kv_dtype in ("float32", "int8"):
        with rsgl.Engine(threads=2, kv_cache_dtype=kv_dtype, progress=False, **weights) as engine:
            ids = engine.tokenize(text)[:512]
            out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
            logprobs[kv_dtype] = np.array([lp for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:]])
    diffs = np.abs(logprobs["int8"] - logprobs["float32"])
    assert diffs.max() < max_diff and diffs.mean() < mean_diff, (diffs.max(), diffs.mean())


def test_activation_bits_other_than_8_or_16_are_refused():
    with pytest.raises(rsgl.InvalidRequestError, match="activation_bits must be 8 or 16"):
        rsgl.Engine(threads=1, activation_bits=12, progress=False)


def test_the_server_with_no_options_answers_the_first_questions_right(tmp_path):
    """What a new user meets first: `python -m rsgl.server`, then a chat question at temperature 0."""
    with running_server(tmp_path, api_key=None) as (url, _):
        client = openai_client(url)
        for country, capital in (("France", "Paris"), ("Italy", "Rome"), ("Japan", "Tokyo")):
            answer = client.chat.completions.create(
                model="default", messages=[{"role": "user", "content": f"What is the capital of {country}?"}], temperature=0, max_tokens=24
            )
            assert capital in answer.choices[0].message.content, answer.choices[0].message.content
    log = (tmp_path / "server.log").read_text()
    assert "weights: bfloat16, quantization w8a8_int8 (activations 8-bit): the default model's Q4_1 weights requantized to W8A8" in log
