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
from pathlib import Path

from rsgl.loader import load_model
from rsgl.loader.export import FLOAT_STORAGE, write_model_folder

CACHE = Path.home() / ".cache" / "rsgl-bench"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="a GGUF file or HF folder (default: rsgl's default model)")
    parser.add_argument("--dtype", choices=list(FLOAT_STORAGE), default="bfloat16", help="stored weight type")
    parser.add_argument("--out", type=Path, default=None, help="the directory to write")
    parser.add_argument("--force", action="store_true", help="rewrite an existing directory")
    return parser.parse_args()


def prepare(model_path: str | None, dtype: str, out: Path | None, force: bool) -> Path:
    """Writes the directory unless it is already there; returns its path."""
    model = load_model(model_path, progress=False)
    out = out or CACHE / f"{Path(model.source).stem.split('.')[0].lower()}-{dtype}"
    if (out / "model.safetensors").is_file() and not force:
        print(f"{out} already holds the model (--force rewrites it)")
        return out
    tensors = dict(model.tensors())
    write_model_folder(out, model, tensors, dtype)
    print(f"wrote {out} ({sum(a.size for a in tensors.values()) / 1e6:.1f} M parameters as {dtype})")
    return out


def main() -> None:
    args = parse_args()
    prepare(args.model, args.dtype, args.out, args.force)


if __name__ == "__main__":
    main()
