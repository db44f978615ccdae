"""`python -m rsgl.quantize`: converts a model's linear layers to int8 for W8A8 serving.

    python -m rsgl.quantize --model-path IN --output OUT [--scheme w8a8_int8] [--dtype bfloat16]

IN is a Hugging Face folder (float32 / float16 / bfloat16) or a GGUF file (dequantized first);
OUT is a Hugging Face folder in the layout of SGLang's w8a8_int8 checkpoints: each linear
layer's `weight` in int8 with a per-output-channel float32 `weight_scale` `[out, 1]` (symmetric:
`weight ≈ int8 * scale`, the scale mapping the channel's largest magnitude to 127), config.json
carrying `"quantization_config": {"quant_method": "w8a8_int8", ...}`. Embeddings, norms and the
lm_head stay in `--dtype`. Activations are quantized per token at run time. rsgl.Engine and
`python -m rsgl.server --model-path OUT` load it as W8A8 without further options.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

from rsgl.errors import RsglError
from rsgl.loader import expected_tensor_shapes, load_model
from rsgl.loader.export import FLOAT_STORAGE, write_model_folder

SCHEMES = ("w8a8_int8",)
# The linear layers a decoder block runs; their weights are quantized.
LINEAR_WEIGHT = re.compile(
    r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj"
    r"|mlp\.((experts\.\d+|shared_expert)\.)?(gate|up|down)_proj"  # dense and Qwen MoE experts
    r"|block_sparse_moe\.experts\.\d+\.w[123])\.weight"  # Mixtral experts (routers stay float)
)


def quantization_config(scheme: str) -> dict:
    """What config.json says of the scheme (SGLang's w8a8_int8 shape)."""
    return {
        "quant_method": scheme,
        "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "channel", "dynamic": False},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "token", "dynamic": True},
        "ignore": ["lm_head"],
    }


def quantize_per_channel(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int8 weights `[out, in]` and float32 scales `[out, 1]`, rounded half to even (torch)."""
    import torch

    w = torch.from_numpy(weight).float()
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero channel stays zero
    q = torch.round(w / scale).clamp(-127, 127).to(torch.int8)
    return q.numpy(), scale.numpy().astype(np.float32)


def convert(model_path: str | None, output: Path, scheme: str, dtype: str, progress: bool = True) -> Path:
    model = load_model(model_path, progress=False)
    tensors: dict[str, np.ndarray] = {}
    stream = model.tensors()
    if progress:
        from tqdm import tqdm

        stream = tqdm(stream, desc=f"quantizing to {scheme}", unit="tensor", total=len(expected_tensor_shapes(model.config)))
    for name, array in stream:
        if LINEAR_WEIGHT.fullmatch(name):
            tensors[name], tensors[name + "_scale"] = quantize_per_channel(array)
        else:
            tensors[name] = array
    write_model_folder(output, model, tensors, dtype, quantization_config(scheme))
    return output


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rsgl.quantize", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", default=None, help="a Hugging Face folder or a .gguf file (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--output", type=Path, required=True, help="the folder to write")
    parser.add_argument("--scheme", choices=SCHEMES, default="w8a8_int8")
    parser.add_argument("--dtype", choices=list(FLOAT_STORAGE), default="bfloat16", help="how the unquantized tensors are stored")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        out = convert(args.model_path, args.output, args.scheme, args.dtype, progress=not args.no_progress)
    except RsglError as error:
        sys.exit(f"rsgl.quantize: {error}")
    print(f"wrote {out} ({args.scheme})")


if __name__ == "__main__":
    main()
