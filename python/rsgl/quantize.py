"""`python -m rsgl.quantize`: converts a model's linear layers once, to int8 (W8A8) or 4 bits (W4A8).

    python -m rsgl.quantize --model-path IN --output OUT [--method w8a8_int8|w4a8|awq]
                            [--group-size 128|64|32] [--dtype bfloat16] [--no-calibration]

IN is a Hugging Face folder (float32 / float16 / bfloat16) or a GGUF file (dequantized first);
OUT is a Hugging Face folder. Embeddings, norms, MoE routers and the lm_head stay in `--dtype`;
activations are quantized per token (w8a8_int8) or per block of 32 inputs (4 bits) at run time.
rsgl.Engine and `python -m rsgl.server --model-path OUT` load each without further options.

- w8a8_int8: SGLang's w8a8_int8 layout: each linear layer's `weight` in int8 with a per-output-
  channel float32 `weight_scale` `[out, 1]` (symmetric: `weight ≈ int8 * scale`, the scale
  mapping the channel's largest magnitude to 127), after SmoothQuant scaling.
- w4a8: rsgl's 4-bit layout, llama.cpp's Q4_1 blocks of 32 inputs (a scale and a float minimum
  each) as bytes, after AWQ's activation-aware scale search (rsgl.quantization.w4a8). The most accurate.
- awq: AutoAWQ's "gemm" layout (groups of --group-size inputs with a scale and an integer zero
  point), after the same search: the checkpoint vLLM and SGLang load too.

Calibration runs the float model (transformers) over a short English text; --no-calibration
quantizes the weights as they are.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

from rsgl.errors import RsglError
from rsgl.loader.export import FLOAT_STORAGE
from rsgl.quantization.convert import GROUP_SIZES, METHODS, convert


def parse_args(argv: list[str] | None, prog: str = "python -m rsgl.quantize") -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-path", default=None, help="a Hugging Face folder or a .gguf file (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--output", type=Path, required=True, help="the folder to write")
    parser.add_argument("--method", "--scheme", dest="method", choices=METHODS, default="w8a8_int8")
    parser.add_argument("--group-size", type=int, choices=GROUP_SIZES, default=128, help="awq: inputs per 4-bit group (a scale and zero point each)")
    parser.add_argument("--dtype", choices=list(FLOAT_STORAGE), default="bfloat16", help="how the unquantized tensors are stored")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument(
        "--no-calibration",
        "--no-smoothing",
        dest="no_calibration",
        action="store_true",
        help="quantize the weights as they are (no SmoothQuant / AWQ scaling from calibration activations)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None, prog: str = "python -m rsgl.quantize") -> None:
    args = parse_args(argv, prog)
    if importlib.util.find_spec("torch") is None:
        sys.exit(f"{prog}: converting a model needs torch, which the core install leaves out: pip install 'rsgl[quantize]'")
    try:
        out = convert(
            args.model_path,
            args.output,
            args.method,
            args.dtype,
            progress=not args.no_progress,
            calibration=not args.no_calibration,
            group_size=args.group_size,
        )
    except RsglError as error:
        sys.exit(f"rsgl.quantize: {error}")
    print(f"wrote {out} ({args.method})")


if __name__ == "__main__":
    main()
