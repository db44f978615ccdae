"""Converting a model's linear layers once, to int8 (W8A8) or 4 bits (W4A8, AWQ): the calibration pass, SmoothQuant's and
AWQ's scaling folded into the float weights, and each method's checkpoint layout (`python -m rsgl.quantize` runs it)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from rsgl._typing import JsonObject
from rsgl.errors import RsglError
from rsgl.loader import expected_tensor_shapes, load_model
from rsgl.loader.export import write_model_folder
from rsgl.quantization import w4a8

if TYPE_CHECKING:
    import torch

METHODS = ("w8a8_int8", "w4a8", "awq")
GROUP_SIZES = (32, 64, 128)  # awq: inputs per group (w4a8's blocks are 32, the kernels' own)
# The linear layers a decoder block runs; their weights are quantized.
LINEAR_WEIGHT = re.compile(
    r"model\.layers\.\d+\.(self_attn\.[qkvo]_proj"
    r"|mlp\.((experts\.\d+|shared_expert)\.)?(gate|up|down)_proj"  # dense and Qwen MoE experts
    r"|block_sparse_moe\.experts\.\d+\.w[123])\.weight"  # Mixtral experts (routers stay float)
)


def quantization_config(method: str) -> JsonObject:
    """What config.json says of a w8a8_int8 checkpoint (SGLang's shape)."""
    return {
        "quant_method": method,
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


def calibration_inputs(model_path: str | None, token_ids: list[int]) -> dict[str, torch.Tensor]:
    """Per decoder layer, the float32 activations `[tokens, channels]` its linear layers read over
    `token_ids`, from a transformers forward pass: `{layer prefix + ".attn" / ".mlp" / ".down"}`."""
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
    inputs: dict[str, torch.Tensor] = {}

    def record(name: str) -> Callable[[torch.nn.Module, tuple[torch.Tensor, ...]], None]:
        def hook(_module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            inputs[name] = args[0].detach()[0].float()

        return hook

    for index, layer in enumerate(hf.model.layers):
        prefix = f"model.layers.{index}"
        layer.self_attn.q_proj.register_forward_pre_hook(record(prefix + ".attn"))
        layer.mlp.gate_proj.register_forward_pre_hook(record(prefix + ".mlp"))
        layer.mlp.down_proj.register_forward_pre_hook(record(prefix + ".down"))
    with torch.no_grad():
        hf(torch.tensor([token_ids]))
    return inputs


class ScalingGroup(NamedTuple):
    """Linear layers that read one input, with what produces that input (a norm or a weight's rows)."""

    inputs_key: str
    consumers: list[str]
    norm: str | None  # the RMSNorm weight before them
    producer_rows: str | None  # the weight whose rows produce the input


def scaling_groups(tensors: dict[str, np.ndarray]) -> Iterator[ScalingGroup]:
    """Per decoder layer, its scaling groups. Scaling input channel j of the consumers' columns by
    s_j and dividing the producer by s_j leaves the float model unchanged."""
    layer = 0
    while f"model.layers.{layer}.input_layernorm.weight" in tensors:
        p = f"model.layers.{layer}"
        yield ScalingGroup(p + ".attn", [f"{p}.self_attn.{x}_proj.weight" for x in "qkv"], f"{p}.input_layernorm.weight", None)
        yield ScalingGroup(p + ".mlp", [f"{p}.mlp.gate_proj.weight", f"{p}.mlp.up_proj.weight"], f"{p}.post_attention_layernorm.weight", None)
        yield ScalingGroup(p + ".down", [f"{p}.mlp.down_proj.weight"], None, f"{p}.mlp.up_proj.weight")
        layer += 1


def fold_scales(tensors: dict[str, np.ndarray], consumers: list[str], norm: str | None, producer_rows: str | None, scale: np.ndarray) -> None:
    for name in consumers:
        tensors[name] = tensors[name] * scale[None, :]
    if norm is not None:
        tensors[norm] = tensors[norm] / scale
    elif producer_rows is not None:
        tensors[producer_rows] = tensors[producer_rows] / scale[:, None]


def smooth(tensors: dict[str, np.ndarray], inputs: dict[str, torch.Tensor], alpha: float = SMOOTHING_ALPHA) -> None:
    """SmoothQuant: per input channel j of a GEMM, divides the activations by
    `s_j = max|x_j|^alpha / max|w_j|^(1 - alpha)` and multiplies the weights' column j by it, so
    activation outliers move into the weights, which are quantized per output channel and take
    them better."""
    for key, consumers, norm, producer_rows in scaling_groups(tensors):
        act = inputs[key].abs().amax(dim=0).numpy()
        w_max = np.max([np.abs(tensors[name]).max(axis=0) for name in consumers], axis=0)
        scale = (np.maximum(act, 1e-5) ** alpha / np.maximum(w_max, 1e-5) ** (1 - alpha)).astype(np.float32)
        fold_scales(tensors, consumers, norm, producer_rows, scale)


def scale_activation_aware(tensors: dict[str, np.ndarray], inputs: dict[str, torch.Tensor], roundtrip: Callable[[np.ndarray], np.ndarray]) -> None:
    """AWQ's scaling (see rsgl.quantization.w4a8) of every layer group, judged through `roundtrip`."""
    for key, consumers, norm, producer_rows in scaling_groups(tensors):
        scale = w4a8.search_scales(inputs[key], [tensors[name] for name in consumers], roundtrip)
        fold_scales(tensors, consumers, norm, producer_rows, scale)


def check_group_size(floats: dict[str, np.ndarray], group_size: int) -> None:
    """Every linear layer must be whole groups: the 4-bit layouts have no room for a partial one."""
    shapes = {name: array.shape for name, array in floats.items() if LINEAR_WEIGHT.fullmatch(name)}
    misfit = next((name for name, shape in shapes.items() if not w4a8.fits(shape, group_size)), None)
    if misfit is not None:
        fitting = [size for size in GROUP_SIZES if all(w4a8.fits(shape, size) for shape in shapes.values())]
        advice = f"pass --group-size {fitting[-1]}" if fitting else "this model cannot be converted to 4 bits"
        raise RsglError(f"{misfit} has shape {list(shapes[misfit])}: its inputs are not whole groups of {group_size}; {advice}.")


def quantized_tensors(floats: dict[str, np.ndarray], method: str, group_size: int) -> dict[str, np.ndarray]:
    """The checkpoint's tensors: linear weights in `method`'s layout, everything else as it is."""
    tensors: dict[str, np.ndarray] = {}
    for name, array in floats.items():
        if not LINEAR_WEIGHT.fullmatch(name):
            tensors[name] = array
        elif method == "w8a8_int8":
            tensors[name], tensors[name + "_scale"] = quantize_per_channel(array)
        elif method == "w4a8":
            tensors[name] = w4a8.q4_1_tensor(array)
        else:
            tensors.update(w4a8.awq_tensors(name, array, group_size))
    return tensors


def convert(model_path: str | None, output: Path, method: str, dtype: str, progress: bool = True, calibration: bool = True, group_size: int = 128) -> Path:
    model = load_model(model_path, progress=False)
    stream = model.tensors()
    if progress:
        from tqdm import tqdm

        stream = tqdm(stream, desc=f"quantizing to {method}", unit="tensor", total=len(expected_tensor_shapes(model.config.fields)))
    floats = dict(stream)
    group_size = w4a8.QBLOCK if method == "w4a8" else group_size
    if method != "w8a8_int8":
        check_group_size(floats, group_size)
    if calibration and not model.config.fields["moe"]:  # MoE: the norm also feeds the router; not scaled
        if model.tokenizer is None:
            raise RsglError("calibration needs the model's tokenizer for its text; pass --no-calibration")
        inputs = calibration_inputs(model_path, model.tokenizer.encode(CALIBRATION_TEXT.read_text()))
        if method == "w8a8_int8":
            smooth(floats, inputs)
        elif method == "w4a8":
            scale_activation_aware(floats, inputs, w4a8.q4_1_roundtrip)
        else:
            scale_activation_aware(floats, inputs, lambda weight: w4a8.awq_roundtrip(weight, group_size))
    config = {"w8a8_int8": quantization_config(method), "w4a8": w4a8.w4a8_config(), "awq": w4a8.awq_config(group_size)}[method]
    write_model_folder(output, model, quantized_tensors(floats, method, group_size), dtype, config)
    return output
