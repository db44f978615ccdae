"""GGUF files (llama.cpp's format): config and tokenizer from the metadata, weights mapped by the
Rust core (which also reads the metadata: gguf-py takes seconds over a vocabulary's strings),
which names and lays them out as a Hugging Face checkpoint
(GGUF lists dimensions innermost first; llama.cpp's converter permutes the q/k rows of llama
models and stacks the experts of mixture-of-experts layers) and dequantizes them as it packs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf

from rsgl._core import WeightStore
from rsgl.errors import ModelLoadError, UnsupportedModelError
from rsgl.loader import (
    SUPPORTED_ARCHITECTURES,
    WEIGHT_DTYPE_PROBE,
    LoadedModel,
    ModelConfig,
    MoeConfig,
    Tensors,
    TokenizerFields,
    check_tensor_shapes,
    make_config,
    unique_ints,
)
from rsgl.loader.tokenizer import GgufVocabulary, special_token_ids, token_bytes, tokenizer_from_gguf

# GGUF architecture names of mixture-of-experts models -> the loader's names (a llama file with
# experts is a Mixtral).
_MOE_ARCHITECTURES = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}
_NATIVE_DTYPE = {"F32": "float32"}
# Storage types whose weights are not quantized (a file of these runs in `dtype`).
_FLOAT_TYPES = ("F32", "F16", "BF16")


def load(path: Path, *, skip_tokenizer_init: bool) -> LoadedModel:
    metadata = _Metadata(WeightStore.gguf_metadata(str(path)))
    gguf_architecture = metadata.require("general.architecture", path)
    if gguf_architecture not in (*SUPPORTED_ARCHITECTURES, *_MOE_ARCHITECTURES):
        supported = ", ".join((*SUPPORTED_ARCHITECTURES, *_MOE_ARCHITECTURES))
        raise UnsupportedModelError(f"{path} holds a {gguf_architecture!r} model; rsgl runs {supported} GGUF files.")
    architecture = _architecture(metadata, gguf_architecture)
    heads = metadata.require(f"{gguf_architecture}.attention.head_count", path)
    kv_heads = metadata.get(f"{gguf_architecture}.attention.head_count_kv", heads)
    open_weights = functools.partial(WeightStore.open_gguf, str(path), architecture, int(heads), int(kv_heads))
    tensors: Tensors = {name: (tuple(shape), stored) for name, shape, stored in open_weights().tensors()}
    if "rope_freqs.weight" in tensors:
        raise UnsupportedModelError(
            f"{path} bakes llama3 RoPE scaling into a rope_freqs tensor, which rsgl does not read yet; load the model's Hugging Face folder instead."
        )
    config = _config(metadata, gguf_architecture, architecture, tensors, path)
    shapes = {name: shape for name, (shape, _) in tensors.items()}
    check_tensor_shapes(shapes, config, path)
    unknown = sorted(name for name in shapes if not name.startswith(("model.", "lm_head.")))
    if unknown:
        raise UnsupportedModelError(f"{path} holds a tensor rsgl does not know ({unknown[0]}); this model variant is not supported.")
    probe = WEIGHT_DTYPE_PROBE if WEIGHT_DTYPE_PROBE in tensors else "model.embed_tokens.weight"
    return LoadedModel(
        config=config,
        open_weights=open_weights,
        source=str(path),
        model_name=path.stem,
        # float32 files compute in float32; F16, BF16 and quantized ones in bfloat16, the fast 16-bit
        # path on CPUs (vLLM's CPU backend casts float16 to bfloat16 too); dtype="float16" keeps F16.
        dtype=_NATIVE_DTYPE.get(tensors[probe][1], "bfloat16"),
        # A quantized file runs in its own quantization, as llama.cpp runs it: the core packs
        # the blocks it has integer kernels for as they are, the rest in `dtype`.
        quantization=None if tensors[probe][1] in _FLOAT_TYPES else "gguf",
        **_tokenizer_fields(metadata, config["vocab_size"], skip_tokenizer_init),
    )


class _Metadata:
    """The GGUF key/value metadata."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self._fields = fields

    def get(self, key: str, default: Any = None) -> Any:
        return self._fields.get(key, default)

    def require(self, key: str, source: Path) -> Any:
        value = self.get(key)
        if value is None:
            raise ModelLoadError(f"{source} lacks the GGUF metadata key {key!r}; the file looks broken: download it again.")
        return value


def _architecture(metadata: _Metadata, gguf_architecture: str) -> str:
    if gguf_architecture in _MOE_ARCHITECTURES:
        return _MOE_ARCHITECTURES[gguf_architecture]
    experts = metadata.get(f"{gguf_architecture}.expert_count", 0)
    return "mixtral" if gguf_architecture == "llama" and experts else gguf_architecture


def _config(metadata: _Metadata, gguf_architecture: str, architecture: str, tensors: Tensors, path: Path) -> ModelConfig:
    def arch_key(key: str, default: Any = None) -> Any:
        return metadata.get(f"{gguf_architecture}.{key}", default)

    def required(key: str) -> Any:
        return metadata.require(f"{gguf_architecture}.{key}", path)

    scaling = arch_key("rope.scaling.type", "none")
    if scaling != "none":
        raise UnsupportedModelError(f"{path} uses {scaling!r} RoPE scaling, which rsgl does not support yet in GGUF.")
    hidden, heads = required("embedding_length"), required("attention.head_count")
    return make_config(
        architecture=architecture,
        hidden_size=hidden,
        intermediate_size=arch_key("feed_forward_length") or required("expert_feed_forward_length"),
        num_hidden_layers=required("block_count"),
        num_attention_heads=heads,
        num_key_value_heads=arch_key("attention.head_count_kv", heads),
        head_dim=arch_key("attention.key_length", hidden // heads),
        vocab_size=arch_key("vocab_size") or tensors["model.embed_tokens.weight"][0][0],
        rms_norm_eps=required("attention.layer_norm_rms_epsilon"),
        rope_theta=arch_key("rope.freq_base", 10000.0),
        rope_scaling=None,
        attention_bias="model.layers.0.self_attn.q_proj.bias" in tensors,
        qk_norm=architecture in ("qwen3", "qwen3_moe"),
        tie_word_embeddings="lm_head.weight" not in tensors,
        max_position_embeddings=required("context_length"),
        moe=_moe(arch_key, architecture),
    )


def _moe(arch_key: Callable[..., Any], architecture: str) -> MoeConfig | None:
    """The sparse MLP of a mixture-of-experts file (every layer sparse), or None."""
    experts = arch_key("expert_count", 0)
    if not experts:
        return None
    return {
        "num_experts": int(experts),
        "experts_per_token": int(arch_key("expert_used_count")),
        "expert_intermediate_size": int(arch_key("expert_feed_forward_length") or arch_key("feed_forward_length")),
        # llama.cpp renormalizes the top-k weights of Mixtral and Qwen3-MoE, not of Qwen2-MoE.
        "norm_topk_prob": bool(arch_key("expert_weights_norm", architecture != "qwen2_moe")),
        "shared_expert_intermediate_size": arch_key("expert_shared_feed_forward_length") or None,
    }


def _tokenizer_fields(metadata: _Metadata, vocab_size: int, skip_tokenizer_init: bool) -> TokenizerFields:
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

    def text_of(token_id: int | None) -> str | None:
        return tokens[token_id] if tokens is not None and token_id is not None else None

    return TokenizerFields(
        tokenizer=tokenizer,
        chat_template=metadata.get("tokenizer.chat_template"),
        bos_token=text_of(ids["bos"]),
        eos_token=text_of(ids["eos"]),
        # llama.cpp adds BOS for SentencePiece vocabularies unless the file says otherwise.
        add_bos_token=bool(metadata.get("tokenizer.ggml.add_bos_token", model == "llama")),
        bos_token_id=ids["bos"],
        eos_token_ids=unique_ints(ids["eos"], ids["eot"]),
        generation_config={},
        token_bytes=None if tokenizer is None else token_bytes(tokenizer, vocab_size),
        special_token_ids=[] if tokenizer is None else special_token_ids(tokenizer),
    )
