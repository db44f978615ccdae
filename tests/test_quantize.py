"""`python -m rsgl.quantize` end to end: a tiny model converted to an SGLang-style w8a8_int8
checkpoint loads as W8A8 and computes exactly what quantizing the original at load computes."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

import rsgl


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
        capture_output=True, text=True, timeout=300,
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
    config["quantization_config"] = {"quant_method": "awq"}
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(rsgl.UnsupportedModelError, match="w8a8_int8"):
        rsgl.Engine(str(broken), progress=False)
