"""Writes a model as a directory that `rsgl-bench generate --model-dir` reads without Python:
config.json (Hugging Face layout), model.safetensors (float32 or bfloat16) and tokenizer.json
(so rsgl.Engine and transformers can load the folder too).

    python benches/prepare_model_dir.py [--model PATH] [--dtype bfloat16|float32] [--out DIR]

The default model is rsgl's (SmolLM2-135M-Instruct, a Q4_1 GGUF, dequantized by the loader); the
default directory is ~/.cache/rsgl-bench/<model>-<dtype>. An existing directory is kept unless
--force: the weights only need writing once.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np

from rsgl.loader import load_model

CACHE = Path.home() / ".cache" / "rsgl-bench"
# The Hugging Face class for each architecture the loader normalizes to.
MODEL_CLASS = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}
SAFETENSORS_DTYPE = {"float32": "F32", "bfloat16": "BF16"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a GGUF file or HF folder (default: rsgl's default model)")
    parser.add_argument("--dtype", choices=list(SAFETENSORS_DTYPE), default="bfloat16", help="stored weight type")
    parser.add_argument("--out", type=Path, default=None, help="the directory to write")
    parser.add_argument("--force", action="store_true", help="rewrite an existing directory")
    return parser.parse_args()


def hf_config(model, dtype: str) -> dict:
    """A transformers config.json from the loader's normalized config."""
    config = dict(model.config)
    architecture = config.pop("architecture")
    config.pop("qk_norm")  # implied by the architecture (qwen3)
    return {
        "architectures": [MODEL_CLASS[architecture]],
        "model_type": architecture,
        "hidden_act": "silu",
        **config,
        "rms_norm_eps": float(str(np.float32(config["rms_norm_eps"]))),  # GGUF stores it as float32: 1e-05, not 9.99999e-06
        "bos_token_id": model.bos_token_id,
        "eos_token_id": model.eos_token_ids[0] if len(model.eos_token_ids) == 1 else model.eos_token_ids,
        "torch_dtype": dtype,
    }


def to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounded to nearest even (numpy has no bfloat16 type)."""
    bits = values.astype(np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))
    return ((bits + rounding) >> 16).astype(np.uint16)


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str) -> None:
    """The safetensors layout: 8-byte little-endian header length, JSON header, raw data."""
    stored = {name: to_bf16_bits(a) if dtype == "bfloat16" else a.astype("<f4") for name, a in tensors.items()}
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, array in stored.items():
        header[name] = {"dtype": SAFETENSORS_DTYPE[dtype], "shape": list(array.shape), "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    encoded = json.dumps(header).encode()
    encoded += b" " * (-len(encoded) % 8)  # the data section starts 8-byte aligned
    with path.open("wb") as file:
        file.write(len(encoded).to_bytes(8, "little"))
        file.write(encoded)
        for array in stored.values():
            file.write(np.ascontiguousarray(array).tobytes())


def prepare(model_path: str | None, dtype: str, out: Path | None, force: bool) -> Path:
    """Writes the directory unless it is already there; returns its path."""
    model = load_model(model_path, progress=False)
    out = out or CACHE / f"{Path(model.source).stem.split('.')[0].lower()}-{dtype}"
    if (out / "model.safetensors").is_file() and not force:
        print(f"{out} already holds the model (--force rewrites it)")
        return out
    out.mkdir(parents=True, exist_ok=True)
    tensors = dict(model.tensors())
    partial = out / "model.safetensors.partial"
    write_safetensors(partial, tensors, dtype)
    (out / "config.json").write_text(json.dumps(hf_config(model, dtype), indent=2) + "\n")
    if model.tokenizer is not None:
        model.tokenizer.save(str(out / "tokenizer.json"))
    os.replace(partial, out / "model.safetensors")  # last: a present model.safetensors means a complete folder
    print(f"wrote {out} ({sum(a.size for a in tensors.values()) / 1e6:.1f} M parameters as {dtype})")
    return out


def main() -> None:
    args = parse_args()
    prepare(args.model, args.dtype, args.out, args.force)


if __name__ == "__main__":
    main()
