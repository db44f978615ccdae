"""rsgl.loader on Hugging Face model folders written by transformers (save_pretrained of tiny random
Llama, Qwen2 and Qwen3 models): the tensors equal the model's state dict (float32, bfloat16 and
sharded checkpoints, tied embeddings); the config normalizes; tokenizer.json, tokenizer_config.json,
chat_template.json and generation_config.json are read as transformers reads them; and broken or
unsupported folders and bad options are refused with typed errors."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch
from loader_helpers import NO_SCALES, TINY, assert_tensors_equal, detokenize, load, loaded_tensors, state_dict
from rsgl.errors import InvalidRequestError, ModelLoadError, UnsupportedModelError
from tiny_models import SAMPLE_TEXTS, train_byte_level_tokenizer
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

TINY_MODELS = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"tie_word_embeddings": True}),
}


def build_tiny(architecture, dtype=torch.float32):
    config_class, model_class, overrides = TINY_MODELS[architecture]
    torch.manual_seed(0)
    config = config_class(**TINY, **overrides)
    return model_class(config).to(dtype).eval()


@pytest.fixture(scope="module")
def tiny_folders(tmp_path_factory):
    """architecture -> (folder, model) for a random tiny model of each supported family."""
    folders = {}
    for architecture in TINY_MODELS:
        model = build_tiny(architecture)
        folder = tmp_path_factory.mktemp(architecture)
        model.save_pretrained(folder)
        folders[architecture] = (folder, model)
    return folders


@pytest.mark.parametrize("architecture", list(TINY_MODELS))
def test_hf_tensors_equal_state_dict(tiny_folders, architecture):
    folder, model = tiny_folders[architecture]
    loaded = load(folder)
    expected = state_dict(model)
    if model.config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    assert_tensors_equal(loaded_tensors(loaded), expected)
    assert loaded.model_name == folder.name and loaded.tokenizer is None


@pytest.mark.parametrize("architecture", list(TINY_MODELS))
def test_hf_config_is_normalized(tiny_folders, architecture):
    folder, model = tiny_folders[architecture]
    assert load(folder).config.fields == {
        "architecture": architecture,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "vocab_size": 320,
        "rms_norm_eps": 1e-5,
        "rope_theta": 50000.0,
        "rope_scaling": None,
        "attention_bias": architecture == "qwen2",
        "qk_norm": architecture == "qwen3",
        "tie_word_embeddings": architecture == "qwen3",
        "max_position_embeddings": 512,
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


def test_checkpoint_without_lm_head_is_tied(tiny_folders, tmp_path):
    folder = tmp_path / "no-tie-flag"
    shutil.copytree(tiny_folders["qwen3"][0], folder)
    config = json.loads((folder / "config.json").read_text())
    del config["tie_word_embeddings"]  # transformers' default is False
    (folder / "config.json").write_text(json.dumps(config))
    loaded = load(folder)
    assert loaded.config.fields["tie_word_embeddings"] is True
    assert "lm_head.weight" not in loaded_tensors(loaded)


def test_bf16_checkpoint_loads_as_float32(tmp_path):
    model = build_tiny("llama", torch.bfloat16)
    model.save_pretrained(tmp_path)
    assert_tensors_equal(loaded_tensors(load(tmp_path)), state_dict(model))


def test_sharded_checkpoint_loads(tmp_path):
    model = build_tiny("qwen2")
    model.save_pretrained(tmp_path, max_shard_size="60KB")
    assert len(list(tmp_path.glob("*.safetensors"))) > 1 and (tmp_path / "model.safetensors.index.json").is_file()
    assert_tensors_equal(loaded_tensors(load(tmp_path)), state_dict(model))


def test_truncated_safetensors_fails_before_loading(tiny_folders, tmp_path):
    folder = tmp_path / "broken"
    shutil.copytree(tiny_folders["llama"][0], folder)
    weights = folder / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 100)
    with pytest.raises(ModelLoadError, match=r"model\.safetensors is corrupt or truncated.*download it again"):
        load(folder)


def test_missing_path_and_missing_config(tmp_path):
    with pytest.raises(ModelLoadError, match=r"no such file or directory.*Hugging Face model folder, a .gguf file, or a Hugging Face Hub id \(org/name\)"):
        load(tmp_path / "nowhere")
    with pytest.raises(ModelLoadError, match="has no config.json"):
        load(tmp_path)


def test_unsupported_architecture(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel.*LlamaForCausalLM"):
        load(tmp_path)


def test_bad_dtype_is_an_invalid_request(tiny_folders):
    with pytest.raises(InvalidRequestError, match="dtype"):
        load(tiny_folders["llama"][0], dtype="int8")
    assert load(tiny_folders["llama"][0], dtype="bfloat16").config.fields["architecture"] == "llama"


def test_hf_tokenizer_and_generation_files(tiny_folders, tmp_path):
    folder = tmp_path / "with-tokenizer"
    shutil.copytree(tiny_folders["llama"][0], folder)
    train_byte_level_tokenizer().save(str(folder / "tokenizer.json"))
    templates = [
        {"name": "tool_use", "template": "tools"},
        {"name": "default", "template": "{{ messages[0]['content'] }}"},
    ]
    tokenizer_config = {
        "bos_token": {"content": "<s>"},
        "eos_token": "</s>",
        "add_bos_token": True,
        "chat_template": templates,
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0], "temperature": 0.6}))

    loaded = load(folder)
    assert (loaded.bos_token, loaded.eos_token, loaded.bos_token_id) == ("<s>", "</s>", 1)
    assert loaded.add_bos_token is False  # the tokenizer adds BOS already
    assert loaded.eos_token_ids == [2, 0]
    assert loaded.generation_config["temperature"] == 0.6
    assert loaded.chat_template == "{{ messages[0]['content'] }}"
    # A vision-language model's processor keeps its template in chat_template.json.
    del tokenizer_config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": "{{ messages[-1]['content'] }}"}))
    assert load(folder).chat_template == "{{ messages[-1]['content'] }}"
    assert [i for i in range(320) if loaded.tokenizer.is_special(i)] == [0, 1, 2]
    assert loaded.tokenizer.vocab_size == 320 and loaded.tokenizer.token_bytes(319) == b""
    for text in SAMPLE_TEXTS:
        ids = loaded.tokenizer.encode(text)
        assert detokenize(loaded, ids) == loaded.tokenizer.decode(ids, skip_special_tokens=False)

    assert load(folder, skip_tokenizer_init=True).tokenizer is None
