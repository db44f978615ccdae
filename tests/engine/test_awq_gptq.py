"""4-bit AWQ and GPTQ checkpoints: tiny random Llama and Qwen2 models whose linear layers are
quantized here (asymmetric min/max per group of inputs) and packed in AutoAWQ's "gemm" layout and
in GPTQ's, loaded by rsgl and compared with transformers running the same dequantized weights
`(q - zero) * scale`: as stored on the W4A8 kernels (against a torch simulation of their int8
activations, and within the W8A8 tests' bound of the float model), dequantized with an explicit
dtype, and act-order GPTQ layers in floats; and the checkpoints rsgl refuses."""

from __future__ import annotations

import copy
import json
import logging

import numpy as np
import pytest
import rsgl
import torch
from rsgl.loader import load_model
from safetensors.torch import save_file
from test_parity import GREEDY, hf_greedy, hf_last_logits, prompt
from tiny_models import build_tiny

# Wide enough for groups of 128 inputs in every layer (hidden 128, intermediate 256).
SHAPE = {"hidden_size": 128, "intermediate_size": 256}
LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
# Left in floats, as AWQ's modules_to_not_convert leaves layers: a checkpoint may mix both.
FLOAT_LAYER = "model.layers.1.mlp.down_proj"
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of an AWQ word holds column 8j + AWQ_ORDER[i]
BLOCK = 32  # inputs per block of rsgl's 4-bit kernels and of their int8 activations


@pytest.fixture(scope="module")
def float_models(tmp_path_factory):
    """{arch: (folder, transformers model)} with every linear layer wide enough for groups of 128."""
    out = {}
    for arch in ("llama", "qwen2"):
        path = tmp_path_factory.mktemp(f"float-{arch}")
        out[arch] = (path, build_tiny(arch, path, **SHAPE))
    return out


def quantize(weight: torch.Tensor, g_idx: torch.Tensor, groups: int, lowest_zero: int):
    """(q uint8 [out, in], zeros [groups, out], float16 scales [groups, out]) of a float weight:
    each group's range, widened to hold 0, in 15 steps. GPTQ's format stores zero - 1 in 4 bits,
    so its zero points start at 1 (`lowest_zero`)."""
    q = torch.empty(weight.shape, dtype=torch.uint8)
    zeros = torch.empty(groups, weight.shape[0], dtype=torch.uint8)
    scales = torch.empty(groups, weight.shape[0], dtype=torch.float16)
    for g in range(groups):
        inputs = (g_idx == g).nonzero().squeeze(1)
        w = weight[:, inputs]
        low, high = w.amin(dim=1).clamp(max=0), w.amax(dim=1).clamp(min=0)
        scales[g] = ((high - low) / 15).clamp(min=1e-8).half()
        step = scales[g].float()
        zeros[g] = torch.round(-low / step).clamp(lowest_zero, 15).to(torch.uint8)
        q[:, inputs] = torch.round(w / step[:, None] + zeros[g].float()[:, None]).clamp(0, 15).to(torch.uint8)
    return q, zeros, scales


def dequantize(q, zeros, scales, g_idx) -> torch.Tensor:
    return (q.float() - zeros[g_idx].T.float()) * scales[g_idx].T.float()


def kernel_weights(q, zeros, scales, g_idx) -> torch.Tensor:
    """The weights rsgl's 4-bit blocks hold: `d * q + m` with `d` the scale and `m = -scale * zero`
    rounded to float16."""
    minimum = (-(scales.float() * zeros.float())).half().float()
    return q.float() * scales[g_idx].T.float() + minimum[g_idx].T


def pack_nibbles(values: torch.Tensor, order=range(8)) -> torch.Tensor:
    """uint8 nibbles [rows, cols] -> int32 [rows, cols/8], nibble i of word j holding column 8j + order[i]."""
    columns = values.to(torch.int64).reshape(values.shape[0], -1, 8)
    words = sum(columns[:, :, column] << (4 * i) for i, column in enumerate(order))
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)  # the same 32 bits, signed


def pack(packing: str, q, zeros, scales, g_idx) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors of one layer, by suffix."""
    if packing == "awq":  # qweight [in, out/8], qzeros [groups, out/8], both in AWQ's column order
        return {"qweight": pack_nibbles(q.T, AWQ_ORDER), "qzeros": pack_nibbles(zeros, AWQ_ORDER), "scales": scales}
    # GPTQ: qweight [in/8, out], nibble i of row r holding input 8r + i; zeros minus one.
    qweight = pack_nibbles(q.T.contiguous().reshape(-1, 8, q.shape[0]).transpose(1, 2).reshape(-1, 8)).reshape(-1, q.shape[0])
    return {"qweight": qweight, "qzeros": pack_nibbles(zeros - 1), "scales": scales, "g_idx": g_idx.to(torch.int32)}


def write_checkpoint(float_folder, model, folder, packing: str, group_size: int, act_order: bool = False, config_changes: dict | None = None):
    """Saves `model` quantized to `folder` as an AWQ or GPTQ checkpoint (`config_changes` made to
    its quantization_config); returns (the model with the dequantized weights, a torch simulation
    of rsgl's W4A8 layers)."""
    dequantized, simulated = copy.deepcopy(model), copy.deepcopy(model)
    tensors = dict(model.state_dict())
    generator = torch.Generator().manual_seed(group_size)
    for layer in range(model.config.num_hidden_layers):
        for linear in LINEARS:
            prefix = f"model.layers.{layer}.{linear}"
            if packing == "awq" and prefix == FLOAT_LAYER:
                continue
            weight = tensors.pop(prefix + ".weight")
            inputs = weight.shape[1]
            # Act-order: GPTQ visits the inputs in its own order and groups them as it goes.
            order = torch.randperm(inputs, generator=generator) if act_order else torch.arange(inputs)
            g_idx = torch.empty(inputs, dtype=torch.long)
            g_idx[order] = torch.arange(inputs) // group_size
            q, zeros, scales = quantize(weight, g_idx, inputs // group_size, lowest_zero=1 if packing == "gptq" else 0)
            tensors.update({f"{prefix}.{suffix}": t for suffix, t in pack(packing, q, zeros, scales, g_idx).items()})
            dequantized.get_submodule(prefix).weight.data = dequantize(q, zeros, scales, g_idx)
            module = simulated.get_submodule(prefix)
            module.weight.data = kernel_weights(q, zeros, scales, g_idx)
            module.register_forward_pre_hook(lambda _, args: (int8_blocks(args[0]),))
    save_file({name: t.contiguous() for name, t in tensors.items()}, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((float_folder / "config.json").read_text())
    if packing == "awq":
        quantization_config = {"quant_method": "awq", "bits": 4, "group_size": group_size, "zero_point": True, "version": "gemm"}
    else:
        quantization_config = {"quant_method": "gptq", "bits": 4, "group_size": group_size, "desc_act": act_order, "sym": False, "checkpoint_format": "gptq"}
    config["quantization_config"] = {**quantization_config, **(config_changes or {})}
    (folder / "config.json").write_text(json.dumps(config))
    return dequantized, simulated


def int8_blocks(x: torch.Tensor) -> torch.Tensor:
    """`x` rounded as rsgl quantizes activations for its 4-bit kernels: per block of 32 values,
    scale max|x| / 127, multiplied by the inverse and rounded half to even."""
    blocks = x.reshape(*x.shape[:-1], -1, BLOCK)
    scale = blocks.abs().amax(dim=-1, keepdim=True) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (torch.round(blocks * (1 / scale)).clamp(-127, 127) * scale).reshape(x.shape)


def prompt_logits(engine: rsgl.Engine, ids: list[int]) -> np.ndarray:
    out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_prompt_logits=True)
    return np.array(out["meta_info"]["prompt_logits"], dtype=np.float32)


@pytest.mark.parametrize(
    "arch, packing, group_size",
    [("llama", "awq", 128), ("llama", "gptq", 128), ("qwen2", "awq", 32), ("qwen2", "gptq", 32)],
)
def test_4bit_checkpoints_run_as_stored(float_models, tmp_path, arch, packing, group_size):
    float_folder, model = float_models[arch]
    dequantized, simulated = write_checkpoint(float_folder, model, tmp_path, packing, group_size)
    stored = {name: kind for name, _, kind in load_model(str(tmp_path), progress=False).open_weights().tensors()}
    assert stored["model.layers.0.self_attn.q_proj.weight"] == packing.upper()
    assert stored["lm_head.weight"] == "F32" and stored["model.embed_tokens.weight"] == "F32"
    ids = prompt(40, 1)
    # Float32 pages: the simulation is exact up to float sums' order.
    with rsgl.Engine(str(tmp_path), threads=2, max_total_tokens=2048, kv_cache_dtype="float32", progress=False) as engine:
        info = engine.get_server_info()
        assert (info["quantization"], info["dtype"]) == (packing, "float32"), info
        # rsgl's arithmetic, simulated: the same quants, int8 activations per block of 32, equal up
        # to float sums' order (about 1e-6 here; a float layer would miss the activations' rounding
        # by 1e-2). Short prompts: in longer ones an activation now and then rounds the other way
        # on one side, which moves the logits by up to 1e-2 too.
        for length in (1, 7):
            ids_n = prompt(length, 10 + length)
            got, want = prompt_logits(engine, ids_n), hf_last_logits(simulated, ids_n)
            assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max(), (length, np.abs(got - want).max())
        out = engine.generate(input_ids=ids[:7], sampling_params=GREEDY)
        assert out["output_ids"] == hf_greedy(simulated, ids[:7], 32)
        # Against the float model with the dequantized weights: int8 rounding of the activations,
        # not a different computation (the W8A8 tests' bound).
        got, want = prompt_logits(engine, ids), hf_last_logits(dequantized, ids)
        assert np.abs(got - want).max() <= 0.1 * np.abs(want).max()
    # An explicit dtype dequantizes the checkpoint: the float model's results.
    with rsgl.Engine(str(tmp_path), dtype="float32", threads=2, max_total_tokens=2048, progress=False) as engine:
        assert engine.get_server_info()["quantization"] is None
        assert np.abs(prompt_logits(engine, ids) - hf_last_logits(dequantized, ids)).max() < 1e-3


def test_act_order_gptq_layers_run_dequantized(float_models, tmp_path, caplog):
    float_folder, model = float_models["llama"]
    dequantized, _ = write_checkpoint(float_folder, model, tmp_path, "gptq", 32, act_order=True)
    with caplog.at_level(logging.WARNING, logger="rsgl"):
        engine = rsgl.Engine(str(tmp_path), threads=2, max_total_tokens=2048, kv_cache_dtype="float32", progress=False)
    with engine:
        assert engine.get_server_info()["quantization"] == "gptq"
        warnings = [r.getMessage() for r in caplog.records if "act-order" in r.getMessage()]
        assert len(warnings) == 1 and "14 GPTQ layer(s)" in warnings[0] and "without desc_act" in warnings[0], warnings
        ids = prompt(40, 2)
        assert np.abs(prompt_logits(engine, ids) - hf_last_logits(dequantized, ids)).max() < 1e-3
        assert engine.generate(input_ids=ids[:5], sampling_params=GREEDY)["output_ids"] == hf_greedy(dequantized, ids[:5], 32)


@pytest.mark.parametrize(
    "packing, change, error, match",
    [
        ("gptq", {"bits": 8}, rsgl.UnsupportedModelError, "8-bit GPTQ checkpoint; rsgl runs 4-bit"),
        ("awq", {"version": "gemv"}, rsgl.UnsupportedModelError, "'gemv' layout; rsgl reads the 'gemm' layout"),
        ("awq", {"zero_point": False}, rsgl.UnsupportedModelError, "zero_point true"),
        ("gptq", {"checkpoint_format": "marlin"}, rsgl.UnsupportedModelError, "'marlin' format"),
        ("awq", {"group_size": 64}, rsgl.ModelLoadError, "do not make a 4-bit AWQ layer in groups of 64 inputs"),
    ],
)
def test_unreadable_4bit_checkpoints_say_why(float_models, tmp_path, packing, change, error, match):
    float_folder, model = float_models["llama"]
    write_checkpoint(float_folder, model, tmp_path, packing, 128, config_changes=change)
    with pytest.raises(error, match=match):
        rsgl.Engine(str(tmp_path), progress=False)


def test_incomplete_or_mismatched_4bit_checkpoints_are_refused(float_models, tmp_path):
    float_folder, model = float_models["llama"]
    write_checkpoint(float_folder, model, tmp_path, "gptq", 128)
    with pytest.raises(rsgl.InvalidRequestError, match="runs AWQ checkpoints as they are stored"):
        rsgl.Engine(str(tmp_path), quantization="awq", progress=False)
    with pytest.raises(rsgl.InvalidRequestError, match="holds float weights.*'w4a8'"):
        rsgl.Engine(str(float_folder), quantization="gptq", progress=False)
    from safetensors.torch import load_file

    tensors = load_file(tmp_path / "model.safetensors")
    del tensors["model.layers.0.mlp.up_proj.qzeros"]
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(rsgl.ModelLoadError, match="up_proj.qweight has no model.layers.0.mlp.up_proj.qzeros"):
        rsgl.Engine(str(tmp_path), progress=False)
