"""Writes a loaded model as a Hugging Face folder: config.json, model.safetensors, tokenizer.json
and chat_template.jinja (used by `python -m rsgl.quantize` and benches/prepare_model_dir.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from rsgl._core import architectures
from rsgl._typing import JsonObject
from rsgl.errors import UnsupportedModelError
from rsgl.loader import LoadedModel, MoeConfig

# The Hugging Face class for each architecture the loader normalizes to.
MODEL_CLASS = {architecture["name"]: architecture["hf_class"] for architecture in architectures()}
# How float arrays are stored, by the dtype name the loader uses.
FLOAT_STORAGE = {"float32": "F32", "bfloat16": "BF16"}
# Arrays stored in their own type whatever the float dtype: quantized weights, AWQ's float16 scales.
EXACT_STORAGE = {np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8", np.dtype(np.int32): "I32", np.dtype(np.float16): "F16"}


def hf_config(model: LoadedModel, dtype: str, quantization_config: JsonObject | None = None) -> JsonObject:
    """A transformers config.json from the loader's normalized config."""
    config: JsonObject = dict(model.config.fields)
    architecture = config.pop("architecture")
    layout = [config.pop(key) for key in ("sliding_window", "activation", "norm_weight_offset", "rotary_dim", "gated_delta_net", "mamba2", "vision")]
    if layout != [None, "silu", 0.0, None, None, None, None]:
        raise UnsupportedModelError(
            f"rsgl cannot write {architecture} checkpoints yet (sliding windows, GeGLU, offset norms, partial rotary, recurrent "
            "layers, vision towers); quantize them at load instead."
        )
    config.pop("qk_norm")  # implied by the architecture (qwen3, qwen3_moe)
    config.pop("pooling")  # sentence-transformers' files carry it, not config.json
    moe = config.pop("moe")
    scales, no_rope_layers = config.pop("scales"), config.pop("no_rope_layers")
    hf = {
        "architectures": [MODEL_CLASS[architecture]],
        "model_type": architecture,
        "hidden_act": "silu",
        **config,
        "bos_token_id": model.bos_token_id,
        "eos_token_id": model.eos_token_ids[0] if len(model.eos_token_ids) == 1 else model.eos_token_ids,
        "torch_dtype": dtype,
    }
    if moe:
        hf.update(_hf_moe_fields(architecture, moe))
    if architecture == "granite":
        hf.update(
            embedding_multiplier=scales["embedding"],
            residual_multiplier=scales["residual"],
            attention_multiplier=scales["attention"],
            logits_scaling=scales["logits_divisor"],
        )
    if no_rope_layers:
        hf["no_rope_layers"] = [int(layer not in no_rope_layers) for layer in range(model.config.fields["num_hidden_layers"])]
    if quantization_config is not None:
        hf["quantization_config"] = quantization_config
    return hf


def _hf_moe_fields(architecture: str, moe: MoeConfig) -> JsonObject:
    """The sparse MLP in the config keys of its transformers class."""
    if architecture == "mixtral":
        return {"num_local_experts": moe["num_experts"], "num_experts_per_tok": moe["experts_per_token"], "intermediate_size": moe["expert_intermediate_size"]}
    fields: JsonObject = {
        "num_experts": moe["num_experts"],
        "num_experts_per_tok": moe["experts_per_token"],
        "moe_intermediate_size": moe["expert_intermediate_size"],
        "norm_topk_prob": moe["norm_topk_prob"],
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
    }
    if moe["shared_expert_intermediate_size"]:
        fields["shared_expert_intermediate_size"] = moe["shared_expert_intermediate_size"]
    return fields


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounded to nearest even (numpy has no bfloat16 type)."""
    bits = values.astype(np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))
    return ((bits + rounding) >> 16).astype(np.uint16)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], float_dtype: str) -> None:
    """The safetensors layout: 8-byte little-endian header length, JSON header, raw data. float32
    arrays are stored in `float_dtype`, the others in their own type (EXACT_STORAGE)."""
    stored: dict[str, tuple[str, np.ndarray]] = {}
    for name, array in tensors.items():
        if array.dtype in EXACT_STORAGE:
            stored[name] = (EXACT_STORAGE[array.dtype], array)
        elif float_dtype == "bfloat16":
            stored[name] = ("BF16", to_bf16_bits(array))
        else:
            stored[name] = ("F32", array.astype("<f4"))
    header: JsonObject = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (kind, array) in stored.items():
        header[name] = {"dtype": kind, "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data section starts 8-byte aligned
    with path.open("wb") as file:
        file.write(len(encoded).to_bytes(8, "little"))
        file.write(encoded)
        for _, array in stored.values():
            file.write(np.ascontiguousarray(array).tobytes())


def write_model_folder(out: Path, model: LoadedModel, tensors: dict[str, np.ndarray], float_dtype: str, quantization_config: JsonObject | None = None) -> None:
    """The whole folder; model.safetensors lands last, so its presence means a complete folder."""
    out.mkdir(parents=True, exist_ok=True)
    partial = out / "model.safetensors.partial"
    write_safetensors(partial, tensors, float_dtype)
    (out / "config.json").write_text(json.dumps(hf_config(model, float_dtype, quantization_config), indent=2) + "\n")
    if model.tokenizer is not None:
        (out / "tokenizer.json").write_text(model.tokenizer.to_str(), encoding="utf-8")
    if model.chat_template is not None:
        (out / "chat_template.jinja").write_text(model.chat_template)
    os.replace(partial, out / "model.safetensors")
