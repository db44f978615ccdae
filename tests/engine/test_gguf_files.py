"""rsgl.loader on GGUF files written by gguf-py as llama.cpp's converter writes them: a tiny llama
(permuted q/k, Q8_0 weights, a SentencePiece vocabulary) loads as the Hugging Face model it came
from, and its tokenizer encodes as transformers' does from the same file, as byte-level BPE
vocabularies do; Rust's reader dequantizes every block type exactly as gguf-py does; and truncated
files, unsupported architectures and files missing a config key are refused with typed errors."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize
from loader_helpers import (
    BASE_CONFIG,
    SCALE_OFFSETS,
    TINY,
    assert_tensors_equal,
    detokenize,
    load,
    loaded_tensors,
    normalized,
    spm_vocabulary,
    state_dict,
)
from rsgl import _core
from rsgl._core import Tokenizer
from rsgl.errors import ModelLoadError, UnsupportedModelError
from tiny_models import SAMPLE_TEXTS, train_byte_level_tokenizer
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

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
    assert loaded.config.fields == {
        **normalized({**BASE_CONFIG, "vocab_size": len(spm_vocabulary()[0])}),
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
        assert [1, *loaded.tokenizer.encode(text)] == reference.encode(text), text
        ids = loaded.tokenizer.encode(text)
        # SentencePiece decoding drops the space it prepended to the text.
        decoded = detokenize(loaded, ids).removeprefix(" ")
        assert decoded == loaded.tokenizer.decode(ids, skip_special_tokens=False), text


@pytest.mark.parametrize("kind", ["F32", "F16", "BF16", *SCALE_OFFSETS])
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
        for offset in SCALE_OFFSETS[kind]:
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
    tokenizer = Tokenizer.from_gguf(tmp_path / "vocab.gguf")
    assert tokenizer is not None
    reference = AutoTokenizer.from_pretrained(tmp_path, gguf_file="vocab.gguf")
    for text in SAMPLE_TEXTS:
        assert tokenizer.encode(text) == reference.encode(text), text
