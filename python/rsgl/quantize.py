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


# Migration strength of SmoothQuant: how much of an input channel's range moves into the weights.
SMOOTHING_ALPHA = 0.5
CALIBRATION_TEXT = Path(__file__).with_name("calibration.txt")


def activation_ranges(model_path: str | None, token_ids: list[int]) -> dict[str, np.ndarray]:
    """Per layer input, the largest |activation| of each channel over `token_ids`, from a
    transformers forward pass: `{layer prefix + ".attn" / ".mlp" / ".down": [channels]}`."""
    import torch
    from transformers import AutoModelForCausalLM

    from rsgl.loader import gguf_file_in
    from rsgl.loader.default_model import default_model_path

    path = Path(model_path or default_model_path())
    gguf = gguf_file_in(path)
    if gguf is not None:
        hf = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    else:
        hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    ranges: dict[str, np.ndarray] = {}

    def record(name):
        def hook(_module, args):
            ranges[name] = args[0].detach().abs().amax(dim=(0, 1)).numpy()
        return hook

    for index, layer in enumerate(hf.model.layers):
        prefix = f"model.layers.{index}"
        layer.self_attn.q_proj.register_forward_pre_hook(record(prefix + ".attn"))
        layer.mlp.gate_proj.register_forward_pre_hook(record(prefix + ".mlp"))
        layer.mlp.down_proj.register_forward_pre_hook(record(prefix + ".down"))
    with torch.no_grad():
        hf(torch.tensor([token_ids]))
    return ranges


def smooth(tensors: dict[str, np.ndarray], ranges: dict[str, np.ndarray], alpha: float = SMOOTHING_ALPHA) -> None:
    """SmoothQuant: per input channel j of a GEMM, divides the activations by
    `s_j = max|x_j|^alpha / max|w_j|^(1 - alpha)` and multiplies the weights' column j by it, so
    activation outliers move into the weights, which are quantized per output channel and take
    them better. The division is folded into what produces the input: the RMSNorm weight before
    q/k/v and gate/up, the up projection's rows before down. The float model is unchanged."""
    layer = 0
    while f"model.layers.{layer}.input_layernorm.weight" in tensors:
        p = f"model.layers.{layer}"
        groups = [
            (ranges[p + ".attn"], [f"{p}.self_attn.{x}_proj.weight" for x in "qkv"], f"{p}.input_layernorm.weight", None),
            (ranges[p + ".mlp"], [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"], f"{p}.post_attention_layernorm.weight", None),
            (ranges[p + ".down"], [f"{p}.mlp.down_proj.weight"], None, f"{p}.mlp.up_proj.weight"),
        ]
        for act, consumers, norm, producer_rows in groups:
            w_max = np.max([np.abs(tensors[name]).max(axis=0) for name in consumers], axis=0)
            scale = (np.maximum(act, 1e-5) ** alpha / np.maximum(w_max, 1e-5) ** (1 - alpha)).astype(np.float32)
            for name in consumers:
                tensors[name] = tensors[name] * scale[None, :]
            if norm is not None:
                tensors[norm] = tensors[norm] / scale
            else:
                tensors[producer_rows] = tensors[producer_rows] / scale[:, None]
        layer += 1


def convert(model_path: str | None, output: Path, scheme: str, dtype: str, progress: bool = True, smoothing: bool = True) -> Path:
    model = load_model(model_path, progress=False)
    tensors: dict[str, np.ndarray] = {}
    stream = model.tensors()
    if progress:
        from tqdm import tqdm

        stream = tqdm(stream, desc=f"quantizing to {scheme}", unit="tensor", total=len(expected_tensor_shapes(model.config)))
    floats = dict(stream)
    if smoothing and not model.config["moe"]:  # MoE: the norm also feeds the router; not smoothed
        if model.tokenizer is None:
            raise RsglError("smoothing needs the model's tokenizer for its calibration text; pass --no-smoothing")
        smooth(floats, activation_ranges(model_path, model.tokenizer.encode(CALIBRATION_TEXT.read_text()).ids))
    for name, array in floats.items():
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
    parser.add_argument("--no-smoothing", action="store_true", help="quantize the weights as they are (no SmoothQuant calibration)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        out = convert(args.model_path, args.output, args.scheme, args.dtype, progress=not args.no_progress, smoothing=not args.no_smoothing)
    except RsglError as error:
        sys.exit(f"rsgl.quantize: {error}")
    print(f"wrote {out} ({args.scheme})")


if __name__ == "__main__":
    main()
