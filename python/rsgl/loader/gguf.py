"""GGUF files (llama.cpp's format): weights of any type gguf-py dequantizes, config and tokenizer
from the metadata.

Tensors come out under Hugging Face names and in Hugging Face layout: GGUF lists dimensions
innermost first, and llama.cpp's converter permutes the q/k projection rows of llama models.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import gguf
import numpy as np
from gguf.quants import dequantize

from rsgl.errors import ModelLoadError, UnsupportedModelError
from rsgl.loader import (
    SUPPORTED_ARCHITECTURES,
    LoadedModel,
    check_tensor_shapes,
    WEIGHT_DTYPE_PROBE,
    expected_tensor_shapes,
    make_config,
    unique_ints,
    with_progress,
)
from rsgl.loader.tokenizer import GgufVocabulary, special_token_ids, token_bytes, tokenizer_from_gguf

# llama.cpp's convert_hf_to_gguf.py permutes q/k rows of these for its rope layout; qwen files are not.
_PERMUTED_ARCHITECTURES = ("llama", "mistral")

_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_LAYER_TENSOR = re.compile(r"blk\.(\d+)\.(\w+)")
_ALWAYS_DEQUANTIZABLE = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)


def load(path: Path, *, skip_tokenizer_init: bool, progress: bool) -> LoadedModel:
    reader = _open_reader(path)
    metadata = _Metadata(reader)
    architecture = metadata.require("general.architecture", path)
    if architecture not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedModelError(
            f"{path} holds a {architecture!r} model; rsgl runs {', '.join(SUPPORTED_ARCHITECTURES)} GGUF files."
        )
    tensors = _tensors_by_hf_name(reader, path)
    config = _config(metadata, architecture, tensors, path)
    check_tensor_shapes({name: _hf_shape(tensor) for name, tensor in tensors.items()}, config, path)
    _check_dequantizable(tensors.values(), path)
    names = list(expected_tensor_shapes(config))
    unpermute = architecture in _PERMUTED_ARCHITECTURES
    return LoadedModel(
        config=config,
        tensors=functools.partial(_read_tensors, tensors, names, config, unpermute, progress),
        source=str(path),
        model_name=path.stem,
        dtype=_native_dtype(tensors[WEIGHT_DTYPE_PROBE]),
        generation_config={},
        **_tokenizer_fields(metadata, config["vocab_size"], skip_tokenizer_init),
    )


class _Metadata:
    """The GGUF key/value metadata, read on demand."""

    def __init__(self, reader: gguf.GGUFReader):
        self._fields = reader.fields

    def get(self, key: str, default=None):
        field = self._fields.get(key)
        return default if field is None else field.contents()

    def require(self, key: str, source: Path):
        value = self.get(key)
        if value is None:
            raise ModelLoadError(
                f"{source} lacks the GGUF metadata key {key!r}; the file looks broken: download it again."
            )
        return value


def _open_reader(path: Path) -> gguf.GGUFReader:
    try:
        return gguf.GGUFReader(path)
    except Exception as error:  # gguf-py raises whatever its parsing hits on a damaged file
        message = f"{path} is corrupt, truncated or not a GGUF file ({error}); download it again."
        raise ModelLoadError(message) from error


def hf_tensor_name(gguf_name: str) -> str | None:
    """The Hugging Face name of a GGUF tensor ("blk.3.attn_q.weight" -> "model.layers.3.self_attn.q_proj.weight")."""
    base, _, kind = gguf_name.rpartition(".")
    layer = _LAYER_TENSOR.fullmatch(base)
    if layer:
        module = _LAYER_TENSORS.get(layer[2])
        return None if module is None else f"model.layers.{layer[1]}.{module}.{kind}"
    module = _GLOBAL_TENSORS.get(base)
    return None if module is None else f"{module}.{kind}"


def _tensors_by_hf_name(reader: gguf.GGUFReader, path: Path) -> dict:
    tensors = {}
    for tensor in reader.tensors:
        if tensor.name == "rope_freqs.weight":
            raise UnsupportedModelError(
                f"{path} bakes llama3 RoPE scaling into a rope_freqs tensor, which rsgl does not read yet; "
                "load the model's Hugging Face folder instead."
            )
        name = hf_tensor_name(tensor.name)
        if name is None:
            raise UnsupportedModelError(
                f"{path} holds a tensor rsgl does not know ({tensor.name}); this model variant is not supported."
            )
        tensors[name] = tensor
    return tensors


def _hf_shape(tensor) -> tuple[int, ...]:
    return tuple(int(size) for size in reversed(tensor.shape))  # GGUF lists the innermost dimension first


def _config(metadata: _Metadata, architecture: str, tensors: dict, path: Path) -> dict:
    def arch_key(key, default=None):
        return metadata.get(f"{architecture}.{key}", default)

    def required(key):
        return metadata.require(f"{architecture}.{key}", path)

    scaling = arch_key("rope.scaling.type", "none")
    if scaling != "none":
        raise UnsupportedModelError(f"{path} uses {scaling!r} RoPE scaling, which rsgl does not support yet in GGUF.")
    hidden, heads = required("embedding_length"), required("attention.head_count")
    return make_config(
        architecture=architecture,
        hidden_size=hidden,
        intermediate_size=required("feed_forward_length"),
        num_hidden_layers=required("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=arch_key("attention.head_count_kv", heads),
        head_dim=arch_key("attention.key_length", hidden // heads),
        vocab_size=arch_key("vocab_size") or _hf_shape(tensors["model.embed_tokens.weight"])[0],
        rms_norm_eps=required("attention.layer_norm_rms_epsilon"),
        rope_theta=arch_key("rope.freq_base", 10000.0),
        rope_scaling=None,
        attention_bias="model.layers.0.self_attn.q_proj.bias" in tensors,
        qk_norm=architecture == "qwen3",
        tie_word_embeddings="lm_head.weight" not in tensors,
        max_position_embeddings=required("context_length"),
    )


def _check_dequantizable(tensors, path: Path) -> None:
    """Fail before loading on a tensor type gguf-py cannot dequantize: try one block of each type."""
    for kind in {tensor.tensor_type for tensor in tensors} - set(_ALWAYS_DEQUANTIZABLE):
        sample = next(tensor for tensor in tensors if tensor.tensor_type == kind)
        block_bytes = gguf.GGML_QUANT_SIZES[kind][1]
        try:
            dequantize(sample.data.reshape(-1)[:block_bytes], kind)
        except NotImplementedError:
            raise UnsupportedModelError(
                f"{path} stores tensors as {kind.name}, which the installed gguf package cannot dequantize; "
                "upgrade it (pip install -U gguf) or use a file with another quantization."
            ) from None


def _read_tensors(tensors: dict, names: list[str], config: dict, unpermute: bool, progress: bool):
    heads = {"q_proj": config["num_attention_heads"], "k_proj": config["num_key_value_heads"]}
    for name in with_progress(names, progress):
        tensor = tensors[name]
        values = dequantize(tensor.data, tensor.tensor_type).reshape(_hf_shape(tensor))
        projection = name.split(".")[-2]
        if unpermute and projection in heads:
            values = unpermute_rows(values, heads[projection])
        yield name, np.ascontiguousarray(values, dtype=np.float32)


def _native_dtype(tensor) -> str:
    """The precision to compute a file's weights in: its own for float files, bfloat16 (the
    fastest 16-bit path) for quantized ones."""
    kind = tensor.tensor_type
    return {gguf.GGMLQuantizationType.F32: "float32", gguf.GGMLQuantizationType.F16: "float16"}.get(kind, "bfloat16")


def unpermute_rows(values: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k permutation, `w.reshape(n_heads, 2, d // 2, ...).swapaxes(1, 2)` per head:
    it interleaves each head's two rotary halves; Hugging Face keeps them as halves."""
    half = values.shape[0] // n_heads // 2
    return values.reshape(n_heads, half, 2, *values.shape[1:]).swapaxes(1, 2).reshape(values.shape)


def _tokenizer_fields(metadata: _Metadata, vocab_size: int, skip_tokenizer_init: bool) -> dict:
    tokens = metadata.get("tokenizer.ggml.tokens")
    roles = ("bos", "eos", "eot", "unknown", "padding")
    ids = {role: metadata.get(f"tokenizer.ggml.{role}_token_id") for role in roles}
    model = metadata.get("tokenizer.ggml.model")
    tokenizer = None
    if tokens is not None and not skip_tokenizer_init:
        tokenizer = tokenizer_from_gguf(
            GgufVocabulary(
                model=model,
                pre=metadata.get("tokenizer.ggml.pre"),
                tokens=tokens,
                token_types=metadata.get("tokenizer.ggml.token_type") or [gguf.TokenType.NORMAL] * len(tokens),
                merges=metadata.get("tokenizer.ggml.merges"),
                scores=metadata.get("tokenizer.ggml.scores"),
                special_ids={index for index in ids.values() if index is not None},
                unknown_id=ids["unknown"],
                add_space_prefix=metadata.get("tokenizer.ggml.add_space_prefix", True),
            )
        )

    def text_of(token_id):
        return tokens[token_id] if tokens is not None and token_id is not None else None

    return {
        "tokenizer": tokenizer,
        "chat_template": metadata.get("tokenizer.chat_template"),
        "bos_token": text_of(ids["bos"]),
        "eos_token": text_of(ids["eos"]),
        # llama.cpp adds BOS for SentencePiece vocabularies unless the file says otherwise.
        "add_bos_token": bool(metadata.get("tokenizer.ggml.add_bos_token", model == "llama")),
        "bos_token_id": ids["bos"],
        "eos_token_ids": unique_ints(ids["eos"], ids["eot"]),
        "token_bytes": None if tokenizer is None else token_bytes(tokenizer, vocab_size),
        "special_token_ids": [] if tokenizer is None else special_token_ids(tokenizer),
    }
