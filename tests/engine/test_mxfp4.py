"""MXFP4 checkpoints as the released gpt-oss folders store them: the tiny gpt-oss fixture
(tests/zoo_models.py) with its experts quantized here to MXFP4 (e2m1 codes rounded to nearest under
one e8m0 scale per block of 32, as OCP and llama.cpp quantize) and written as transformers'
`_blocks`/`_scales` pairs, and the GGUF file llama.cpp's converter writes of that folder (its MXFP4
blocks repacked as they are). rsgl runs both as stored on the W4A8 kernels and gives transformers'
greedy tokens with the same weights dequantized; an explicit dtype dequantizes them."""

from __future__ import annotations

import json

import numpy as np
import pytest
import rsgl
import safetensors.torch
import torch
from gguf_convert import convert
from rsgl.loader import load_model
from test_zoo import PROMPTS, rsgl_greedy, transformers_greedy
from zoo_models import build_family

E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)
BLOCK = 32
EXPERT_TENSORS = ("gate_up_proj", "down_proj")


def quantize_mxfp4(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(blocks uint8 [..., cols / 32, 16], scales uint8 [..., cols / 32]) of float rows [..., cols]: per block
    the e8m0 scale 2^(floor(log2(amax)) - 2) (llama.cpp's quantize_row_mxfp4_ref), each value the nearest
    code (the first of equals), two codes per byte in Hugging Face's order (value 2j low, 2j + 1 high)."""
    values = rows.reshape(*rows.shape[:-1], rows.shape[-1] // BLOCK, BLOCK).astype(np.float32)
    amax = np.abs(values).max(axis=-1)
    exponent = np.where(amax > 0, np.floor(np.log2(np.where(amax > 0, amax, 1.0))) - 2 + 127, 0).clip(0, 254)
    scale = np.ldexp(np.float32(1.0), (exponent - 127).astype(np.int32))[..., None]
    codes = np.abs(values[..., None] - E2M1 * scale[..., None]).argmin(axis=-1).astype(np.uint8)
    return codes[..., 0::2] | (codes[..., 1::2] << 4), exponent.astype(np.uint8)


def dequantize_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    codes = np.stack([blocks & 0x0F, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], BLOCK)
    values = E2M1[codes] * np.ldexp(np.float32(1.0), scales.astype(np.int32) - 127)[..., None]
    return values.reshape(*values.shape[:-2], -1)


@pytest.fixture(scope="module")
def mxfp4_model(tmp_path_factory):
    """(folder of the MXFP4 checkpoint, transformers model holding its dequantized weights)."""
    path = tmp_path_factory.mktemp("gpt_oss_mxfp4")
    model = build_family("gpt_oss", path)
    tensors = safetensors.torch.load_file(path / "model.safetensors")
    params = dict(model.named_parameters())
    for name in [name for name in tensors if name.endswith(tuple(f"mlp.experts.{t}" for t in EXPERT_TENSORS))]:
        # transformers keeps the experts as x @ W ([E, in, out]); MXFP4 checkpoints store nn.Linear rows [E, out, in].
        linear = tensors.pop(name).transpose(1, 2).contiguous().numpy()
        blocks, scales = quantize_mxfp4(linear)
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = torch.from_numpy(blocks), torch.from_numpy(scales)
        with torch.no_grad():
            params[name].copy_(torch.from_numpy(dequantize_mxfp4(blocks, scales)).transpose(1, 2))
    safetensors.torch.save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    not_converted = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
    config["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": not_converted}
    (path / "config.json").write_text(json.dumps(config))
    return path, model


def test_quantizer_rounds_to_the_nearest_code_under_a_power_of_two_scale():
    row = np.array([[0.0] * 31 + [6.0]], dtype=np.float32) * np.float32(2.0**-3)
    row[0, 1:5] = [0.03, -0.06, 0.1, 0.7]
    blocks, scales = quantize_mxfp4(row)
    assert scales.tolist() == [[124]]  # amax 0.75: scale 2^(floor(log2 0.75) - 2) = 2^-3
    assert dequantize_mxfp4(blocks, scales)[0, :5].tolist() == [0.0, 0.0, -0.0625, 0.125, 0.75]


def test_mxfp4_checkpoints_run_as_stored(mxfp4_model):
    path, model = mxfp4_model
    stored = {name: kind for name, _, kind in load_model(str(path), progress=False).open_weights().tensors()}
    assert stored["model.layers.0.mlp.experts.gate_up_proj"] == "MXFP4" and stored["model.layers.1.mlp.experts.down_proj"] == "MXFP4"
    assert not any(name.endswith(("_blocks", "_scales")) for name in stored)
    want = [transformers_greedy(model, ids) for ids in PROMPTS]
    # 16-bit activations (int8 plus its residual): the experts' products are the dequantized weights' to ~1e-5.
    alone, batched = rsgl_greedy(path, PROMPTS, activation_bits=16)
    assert alone == want and batched == want
    with rsgl.Engine(str(path), threads=1, progress=False) as engine:
        assert engine.get_server_info()["quantization"] == "mxfp4"
    # An explicit dtype dequantizes the experts to floats.
    assert rsgl_greedy(path, PROMPTS, dtype="float32") == (want, want)


def test_mxfp4_gguf_files_run_as_stored(mxfp4_model, tmp_path):
    path, model = mxfp4_model
    gguf_file = convert(path, tmp_path / "gpt_oss_mxfp4.gguf")
    loaded = load_model(str(gguf_file), progress=False)
    stored = {name: kind for name, _, kind in loaded.open_weights().tensors()}
    assert stored["model.layers.0.mlp.experts.0.gate_proj.weight"] == "MXFP4" and stored["model.embed_tokens.weight"] == "F32"
    assert (loaded.quantization, loaded.dtype) == ("gguf", "float32")
    want = [transformers_greedy(model, ids) for ids in PROMPTS]
    assert rsgl_greedy(gguf_file, PROMPTS, activation_bits=16) == (want, want)
