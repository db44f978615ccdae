"""4-bit weights for `python -m rsgl.quantize`: two checkpoint layouts and AWQ's activation-aware
scale search (Lin et al., 2023), which both use.

- `w4a8` (rsgl's own): each linear weight's rows in llama.cpp's Q4_1 blocks (32 inputs, a float16
  scale d and minimum m, `weight ≈ d * q + m`, q in 0..15), stored as bytes: exactly what the
  W4A8 kernels run and what `quantization="w4a8"` computes at load. The float minimum matters:
  on the default model, integer zero points (AWQ's) cost 29% perplexity, float minimums nothing.
- `awq`: AutoAWQ's "gemm" layout (groups of 32, 64 or 128 inputs, a float16 scale and a 4-bit
  integer zero point each, `weight ≈ (q - zero) * scale`), which vLLM, SGLang and transformers
  load too.

Before quantizing, AWQ multiplies each input channel j of the layers that share an input by s_j
and divides what produces that input by it (the float model is unchanged), so channels that see
large activations get finer steps: `s = mean|x|^alpha`, alpha picked per layer group from a grid
by the output error on calibration activations. alpha = 0 (no scaling) is in the grid, so the
search never does worse on them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from rsgl._typing import JsonObject

if TYPE_CHECKING:
    import torch

QBLOCK = 32  # inputs per Q4_1 block, the kernels' block
Q4_1_BYTES = 20  # float16 d, float16 m, 16 bytes of nibbles
LEVELS = 15  # 4 bits
# AutoAWQ's "gemm" layout: nibble i (bits 4i..4i+3) of an int32 holds column 8j + ORDER[i].
AWQ_NIBBLE_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)
# The grid of AWQ's exponent, as AutoAWQ searches it.
ALPHA_GRID = tuple(i / 20 for i in range(20))
# Calibration tokens an error is measured on (enough to rank the grid, cheap at 8B shapes).
SEARCH_TOKENS = 256


def w4a8_config() -> JsonObject:
    """config.json's quantization_config of an rsgl w4a8 checkpoint."""
    return {
        "quant_method": "w4a8",
        "weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group", "group_size": QBLOCK, "format": "ggml_q4_1"},
        "input_activations": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "group", "group_size": QBLOCK, "dynamic": True},
        "ignore": ["lm_head"],
    }


def awq_config(group_size: int) -> JsonObject:
    """config.json's quantization_config of an AWQ checkpoint (AutoAWQ's fields)."""
    return {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm", "modules_to_not_convert": None}


# ---- rsgl's layout: Q4_1 blocks ------------------------------------------------------------------


def q4_1_quantize(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q uint8 `[out, blocks, 32]`, d float16 `[out, blocks]`, m float16) as llama.cpp's reference
    Q4_1 quantizer and rsgl's at-load w4a8 compute them (float32 steps, rounding half up)."""
    blocks = weight.astype(np.float32).reshape(weight.shape[0], -1, QBLOCK)
    low, high = blocks.min(axis=2), blocks.max(axis=2)
    d = (high - low) / np.float32(LEVELS)
    inverse = np.divide(np.float32(1), d, out=np.zeros_like(d), where=d != 0)
    q = np.clip(((blocks - low[..., None]) * inverse[..., None] + np.float32(0.5)).astype(np.int32), 0, LEVELS)
    return q.astype(np.uint8), d.astype(np.float16), low.astype(np.float16)


def q4_1_roundtrip(weight: np.ndarray) -> np.ndarray:
    q, d, m = q4_1_quantize(weight)
    return (q * d.astype(np.float32)[..., None] + m.astype(np.float32)[..., None]).reshape(weight.shape)


def q4_1_tensor(weight: np.ndarray) -> np.ndarray:
    """The weight `[out, in]` as Q4_1 block bytes `[out, in / 32 * 20]`."""
    q, d, m = q4_1_quantize(weight)
    nibbles = q[..., : QBLOCK // 2] | (q[..., QBLOCK // 2 :] << 4)  # ggml's order: inputs j and j + 16
    blocks = np.concatenate([d[..., None].view(np.uint8), m[..., None].view(np.uint8), nibbles], axis=2)
    return blocks.reshape(weight.shape[0], -1)


# ---- AWQ's layout ----------------------------------------------------------------------------------


def awq_quantize(weight: np.ndarray, group_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(q uint8 `[out, in]`, zeros uint8 `[in/group, out]`, scales float16 `[in/group, out]`):
    each group's range [min, max], widened to hold 0, in 15 steps."""
    out_features, in_features = weight.shape
    groups = weight.astype(np.float32).reshape(out_features, in_features // group_size, group_size)
    low, high = np.minimum(groups.min(axis=2), 0), np.maximum(groups.max(axis=2), 0)
    scales = np.maximum((high - low) / LEVELS, 1e-8).astype(np.float16)  # rounded as stored
    step = scales.astype(np.float32)
    zeros = np.clip(np.round(-low / step), 0, LEVELS)
    q = np.clip(np.round(groups / step[..., None] + zeros[..., None]), 0, LEVELS)
    return q.reshape(out_features, in_features).astype(np.uint8), zeros.T.astype(np.uint8), scales.T.copy()


def awq_roundtrip(weight: np.ndarray, group_size: int) -> np.ndarray:
    q, zeros, scales = awq_quantize(weight, group_size)
    groups = q.astype(np.float32).reshape(weight.shape[0], -1, group_size)
    restored: np.ndarray = ((groups - zeros.T[..., None]) * scales.T.astype(np.float32)[..., None]).reshape(weight.shape)
    return restored


def pack_awq(nibbles: np.ndarray) -> np.ndarray:
    """uint8 nibbles `[rows, cols]` -> int32 `[rows, cols / 8]` in AWQ's nibble order."""
    columns = nibbles.astype(np.uint32).reshape(nibbles.shape[0], -1, 8)
    packed = np.zeros(columns.shape[:2], dtype=np.uint32)
    for position, column in enumerate(AWQ_NIBBLE_ORDER):
        packed |= columns[:, :, column] << np.uint32(4 * position)
    return packed.view(np.int32)


def awq_tensors(name: str, weight: np.ndarray, group_size: int) -> dict[str, np.ndarray]:
    """The tensors that replace the linear weight `name`: `X.qweight`, `X.qzeros`, `X.scales`."""
    q, zeros, scales = awq_quantize(weight, group_size)
    prefix = name.removesuffix(".weight")
    return {prefix + ".qweight": pack_awq(np.ascontiguousarray(q.T)), prefix + ".qzeros": pack_awq(zeros), prefix + ".scales": scales}


# ---- both --------------------------------------------------------------------------------------------


def fits(shape: tuple[int, ...], group_size: int) -> bool:
    """Whether the 4-bit layouts hold a weight of this shape (AWQ packs 8 outputs per int32)."""
    out_features, in_features = shape
    return out_features % 8 == 0 and in_features % group_size == 0


def search_scales(inputs: torch.Tensor, weights: list[np.ndarray], roundtrip: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """AWQ's per-input-channel scales for the layers `weights` (`[out, in]` each) that all read
    `inputs` (a torch `[tokens, in]`): the alpha of ALPHA_GRID whose outputs, with the weights
    through `roundtrip` (quantized and back), are closest to the float ones."""
    import torch

    x = inputs[:: max(1, inputs.shape[0] // SEARCH_TOKENS)].float()
    reference = [x @ torch.tensor(w, dtype=torch.float32).T for w in weights]
    mean_magnitude = x.abs().mean(dim=0).clamp(min=1e-4)
    best, best_error = torch.ones_like(mean_magnitude), None
    for alpha in ALPHA_GRID:
        scales = mean_magnitude.pow(alpha)
        scales = scales / (scales.max() * scales.min()).sqrt()  # centred, as AutoAWQ does
        error = 0.0
        for w, expected in zip(weights, reference):
            quantized = torch.from_numpy(roundtrip(w * scales.numpy()[None, :]))
            error += ((x / scales) @ quantized.T - expected).pow(2).mean().item()
        if best_error is None or error < best_error:
            best, best_error = scales, error
    return best.numpy().astype(np.float32)
