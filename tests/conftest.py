"""Shared fixtures: tiny random Hugging Face models saved by transformers (built offline from a
config), dense and mixture-of-experts, and the rule that tests leave one core to whatever else
runs; and a server per test module that asks for one, with its clients."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest
import torch
from server_helpers import AUTH, openai_client, running_server
from tiny_models import SPECIAL_TOKENS, TINY, byte_tokenizer

torch.set_num_threads(1)


DENSE_ARCHS = ("llama", "llama3", "mistral", "qwen2", "qwen3")
# Mixtral (top-2 of 4, renormalized), Qwen2-MoE (top-2 of 4 unnormalized, plus the gated shared
# expert) and Qwen3-MoE (top-2 of 4, norm_topk_prob, q/k norm).
MOE_ARCHS = ("mixtral", "qwen2_moe", "qwen3_moe")
MOE = dict(num_experts_per_tok=2, moe_intermediate_size=48)


def build_tiny(arch: str, path, **overrides):
    """Saves a random model of one of DENSE_ARCHS or MOE_ARCHS to `path`; returns the transformers model."""
    import transformers

    llama3_rope = {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16,
        "rope_theta": 500000.0,
    }
    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"rope_theta": 10000.0}),
        # Short original context so the 64-token prompts reach the scaled frequencies.
        "llama3": (transformers.LlamaConfig, transformers.LlamaForCausalLM, {"rope_parameters": llama3_rope, "tie_word_embeddings": True}),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, {"sliding_window": None}),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, {}),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, {"head_dim": 16}),
        "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM, {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None}),
        "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM, {**MOE, "num_experts": 4, "shared_expert_intermediate_size": 80}),
        "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM, {**MOE, "num_experts": 4, "norm_topk_prob": True, "head_dim": 16}),
    }
    config_cls, model_cls, extra = classes[arch]
    torch.manual_seed(sum(map(ord, arch)))
    config = config_cls(**{**TINY, **extra, **overrides})
    model = model_cls(config).eval().float()
    model.save_pretrained(path)
    return model


def build_byte_llama(path, **tokenizer_config):
    """A tiny random Llama in `path` with one token per byte (tiny_models.byte_tokenizer) and
    `tokenizer_config` (beside its BOS and EOS); returns (transformers model, tokenizer)."""
    model = build_tiny("llama", path, vocab_size=len(SPECIAL_TOKENS) + 256)
    tokenizer = byte_tokenizer()
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>", "eos_token": "</s>", **tokenizer_config}))
    return model, tokenizer


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """{arch: (path, transformers model)} for the dense Llama-family variants and the MoE ones."""
    out = {}
    for arch in DENSE_ARCHS + MOE_ARCHS:
        path = tmp_path_factory.mktemp(f"tiny-{arch}")
        out[arch] = (str(path), build_tiny(arch, path))
    return out


# ---- a server per test module (python -m rsgl.server on loopback), and its clients ----------------


@pytest.fixture(scope="module")
def server_started_at() -> float:
    """time.time() just before the module's server is launched (server_url depends on it)."""
    return time.time()


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory, server_started_at: float):
    with running_server(tmp_path_factory.mktemp("server")) as (url, _):
        yield url


@pytest.fixture(scope="module")
def http(server_url: str):
    with httpx.Client(base_url=server_url, headers=AUTH, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def client(server_url: str) -> openai.OpenAI:
    return openai_client(server_url)


@pytest.fixture(scope="module")
def model(http: httpx.Client) -> str:
    """The served model's name."""
    return http.get("/v1/models").json()["data"][0]["id"]
