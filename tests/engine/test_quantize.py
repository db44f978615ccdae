"""`python -m rsgl.quantize` end to end: a tiny model converted to an SGLang-style w8a8_int8
checkpoint loads as W8A8 and computes exactly what quantizing the original at load computes; the
4-bit conversions (rsgl's w4a8 Q4_1 blocks, AWQ's layout) load as 4 bits and compute what their
stored weights say; AWQ's scale search picks scales that lower the quantized output error."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import rsgl
from rsgl.quantization import w4a8
from safetensors.numpy import load_file


# qwen2: q/k/v biases stay float next to int8 weights; the MoE ones: experts (and Qwen2-MoE's
# shared expert) quantized, routers kept float.
@pytest.fixture(scope="module", params=["qwen2", "mixtral", "qwen2_moe"])
def converted(request, tiny_models, tmp_path_factory):
    source, _ = tiny_models[request.param]
    out = tmp_path_factory.mktemp("w8a8") / f"{request.param}-w8a8"
    run = subprocess.run(
        # The tiny models have no tokenizer to calibrate with, and unsmoothed weights must equal
        # quantizing at load.
        [sys.executable, "-m", "rsgl.quantize", "--model-path", str(source), "--output", str(out), "--dtype", "float32", "--no-smoothing"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    return source, out


def test_the_checkpoint_has_sglangs_layout(converted):
    _, out = converted
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "w8a8_int8"
    weights = load_file(out / "model.safetensors")  # Hugging Face's reader, not rsgl's
    int8 = [name for name, array in weights.items() if array.dtype == np.int8]
    assert "model.layers.0.self_attn.o_proj.weight" in int8
    for name in int8:
        assert weights[name + "_scale"].shape == (weights[name].shape[0], 1)
        assert np.abs(weights[name].astype(np.int32)).max() == 127  # each channel's largest weight maps to 127
    floats = [name for name, array in weights.items() if array.dtype == np.float32]
    assert "model.embed_tokens.weight" in floats and "model.norm.weight" in floats
    assert not [name for name in int8 if name.endswith(("gate.weight", "norm.weight"))]  # routers, norms


def test_it_serves_as_w8a8_like_quantizing_at_load(converted):
    source, out = converted
    ids = np.random.default_rng(7).integers(3, 200, size=23).tolist()
    params = {"max_new_tokens": 0}
    logits = []
    for path, options in ((out, {}), (source, {"quantization": "w8a8_int8"})):
        with rsgl.Engine(str(path), dtype="float32", threads=2, max_total_tokens=512, progress=False, **options) as engine:
            assert engine.get_server_info()["quantization"] == "w8a8_int8"
            out_ = engine.generate(input_ids=ids, sampling_params=params, return_prompt_logits=True)
            logits.append(np.array(out_["meta_info"]["prompt_logits"], dtype=np.float32))
    assert np.array_equal(logits[0], logits[1])


def test_unknown_quantized_checkpoints_are_refused(converted, tmp_path):
    _, out = converted
    broken = tmp_path / "awq"
    broken.mkdir()
    for f in out.iterdir():
        (broken / f.name).write_bytes(f.read_bytes())
    config = json.loads((broken / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "bitsandbytes"}
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(rsgl.UnsupportedModelError, match="w8a8_int8"):
        rsgl.Engine(str(broken), progress=False)


def convert(source, out, *options) -> None:
    command = [sys.executable, "-m", "rsgl.quantize", "--model-path", str(source), "--output", str(out), "--dtype", "float32", "--no-calibration"]
    run = subprocess.run([*command, *options], check=False, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr


def prompt_logits(path, **options) -> tuple[np.ndarray, str]:
    """The last position's logits of a fixed prompt, and the quantization the engine runs."""
    ids = np.random.default_rng(7).integers(3, 200, size=23).tolist()
    # The tiny models and their conversions keep floats in float32: dtype "auto" computes in it.
    with rsgl.Engine(str(path), threads=2, max_total_tokens=512, progress=False, **options) as engine:
        out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_prompt_logits=True)
        return np.array(out["meta_info"]["prompt_logits"], dtype=np.float32), engine.get_server_info()["quantization"]


def test_w4a8_checkpoints_hold_q4_1_blocks_and_serve_as_quantizing_at_load(tiny_models, tmp_path):
    source, _ = tiny_models["qwen2"]
    out = tmp_path / "w4a8"
    convert(source, out, "--method", "w4a8")
    assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "w4a8"
    weights = load_file(out / "model.safetensors")
    down = weights["model.layers.0.mlp.down_proj.weight"]
    assert down.dtype == np.uint8 and down.shape == (64, 96 // 32 * 20)  # [out, blocks x 20 bytes]
    assert weights["model.layers.0.self_attn.q_proj.bias"].dtype == np.float32
    converted, quantization = prompt_logits(out)
    assert quantization == "w4a8"
    at_load, _ = prompt_logits(source, quantization="w4a8")
    assert np.array_equal(converted, at_load)


def test_awq_checkpoints_have_autoawqs_layout_and_serve_what_they_store(tiny_models, tmp_path):
    import copy

    import torch

    source, shared_model = tiny_models["llama"]
    model = copy.deepcopy(shared_model)  # the fixture's model is shared: its weights stay as they are
    out = tmp_path / "awq"
    convert(source, out, "--method", "awq", "--group-size", "32")
    config = json.loads((out / "config.json").read_text())["quantization_config"]
    assert config == w4a8.awq_config(32)
    weights = load_file(out / "model.safetensors")
    prefix = "model.layers.1.mlp.up_proj"
    assert weights[prefix + ".qweight"].shape == (64, 96 // 8) and weights[prefix + ".qweight"].dtype == np.int32
    assert weights[prefix + ".qzeros"].shape == (2, 96 // 8) and weights[prefix + ".scales"].shape == (2, 96)
    assert weights[prefix + ".scales"].dtype == np.float16
    # transformers' model with its weights as the AWQ quantizer rounds them is what rsgl serves.
    reference = {
        name: torch.from_numpy(w4a8.awq_roundtrip(param.detach().numpy(), 32)) for name, param in model.named_parameters() if name.endswith("proj.weight")
    }
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name in reference:
                param.copy_(reference[name])
        ids = np.random.default_rng(7).integers(3, 200, size=23).tolist()
        expected = model(torch.tensor([ids])).logits[0, -1].numpy()
    served, quantization = prompt_logits(out)
    assert quantization == "awq"
    # rsgl quantizes activations to int8 per block of 32: close, not equal.
    assert np.abs(served - expected).max() < 0.05 * np.abs(expected).max()
    assert served.argmax() == expected.argmax()


def test_the_awq_search_lowers_the_output_error_of_a_channel_with_outliers():
    import torch

    rng = np.random.default_rng(3)
    x = torch.from_numpy(rng.standard_normal((512, 64)).astype(np.float32))
    x[:, 5] *= 40  # one input channel sees activations far larger than the others
    weight = rng.standard_normal((32, 64)).astype(np.float32)

    def error(scales: np.ndarray) -> float:
        quantized = w4a8.q4_1_roundtrip(weight * scales[None, :])
        return float(((x / torch.from_numpy(scales)) @ torch.from_numpy(quantized).T - x @ torch.from_numpy(weight).T).pow(2).mean())

    scales = w4a8.search_scales(x, [weight], w4a8.q4_1_roundtrip)
    assert scales[5] > np.median(scales)  # the salient channel gets finer steps
    assert error(scales) < 0.9 * error(np.ones(64, dtype=np.float32))


def test_4_bit_conversion_refuses_shapes_not_in_whole_groups(tiny_models, tmp_path):
    source, _ = tiny_models["llama"]
    command = [sys.executable, "-m", "rsgl.quantize", "--model-path", str(source), "--output", str(tmp_path / "x"), "--method", "awq", "--no-calibration"]
    run = subprocess.run(command, check=False, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "not whole groups of 128; pass --group-size 32" in run.stderr
