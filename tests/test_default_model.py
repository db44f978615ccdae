"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF) against transformers loading the same
file (same dequantized weights, fp32): greedy tokens must be identical."""

from __future__ import annotations

import os

import pytest
import torch

import rsgl
from rsgl.loader.default_model import default_model_path

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
    with rsgl.Engine(threads=2, progress=False) as engine:
        yield engine


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_32_tokens_match_transformers(prompt, llm, hf_model):
    ids = llm.encode(prompt)
    got = llm.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 32, "ignore_eos": True})
    with torch.no_grad():
        out = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False, eos_token_id=None, pad_token_id=0)
    want = out[0, len(ids):].tolist()
    assert len(want) == 32
    assert got["output_ids"] == want
