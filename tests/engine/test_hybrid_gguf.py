"""Hybrid models (Qwen3.5, Qwen3-Next) from the GGUF files llama.cpp's own converter writes of tiny random
checkpoints (tests/zoo_models.py), with a multi-token prediction layer as the Hub's checkpoints have: the
file's float32 greedy tokens identical to transformers' on the folder, alone, batched and split over prefill
steps, though the converter stores the DeltaNet's decay as -exp(A_log), squeezes its convolution, splits
Qwen3-Next's fused projections, tiles Qwen3.5's value heads (two per key head here), adds 1 to the norms and
appends the prediction layer; the file's config is the folder's but for what the file says otherwise. A Q8_0
file runs as stored, its next token after prompts of several tokens transformers' own."""

from __future__ import annotations

import json

import gguf
import pytest
import rsgl
import safetensors.torch
import torch
from gguf_convert import convert
from loader_helpers import normalized
from rsgl import _core
from test_hybrid import GREEDY, PROMPTS, generate, transformers_greedy
from zoo_models import build_family

# The full-attention layer the multi-token prediction layer copies (zoo_models.HYBRID's layer_types).
ATTENTION_LAYER = 3


def with_prediction_layer(path, hidden: int) -> None:
    """Adds to the checkpoint at `path` a multi-token prediction layer (`mtp.*`, which neither transformers
    nor rsgl reads) as Qwen3.5 and Qwen3-Next ship one: llama.cpp's converter appends it as a last block."""
    weights = safetensors.torch.load_file(path / "model.safetensors")
    layer = f"model.layers.{ATTENTION_LAYER}."
    weights |= {"mtp.layers.0." + name.removeprefix(layer): w.clone() for name, w in weights.items() if name.startswith(layer)}
    weights["mtp.fc.weight"] = torch.randn(hidden, 2 * hidden) * 0.1
    weights |= {f"mtp.{norm}.weight": torch.zeros(hidden) for norm in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm")}
    safetensors.torch.save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def hybrid_gguf(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = build_family(request.param, folder)
    with_prediction_layer(folder, model.config.hidden_size)
    return folder, convert(folder, folder.parent / f"{request.param}.gguf"), transformers_greedy(model, PROMPTS)


def test_float32_greedy_tokens_from_the_gguf_file_match_transformers(hybrid_gguf):
    _, gguf_file, want = hybrid_gguf
    alone, batched, _ = generate(gguf_file, PROMPTS)
    assert alone == want
    assert batched == want
    alone, batched, _ = generate(gguf_file, PROMPTS, chunked_prefill_size=24)
    assert (alone, batched) == (want, want)


def test_the_gguf_config_is_the_folders(hybrid_gguf):
    """What differs is what the file holds otherwise: norm weights stored as the 1 + w they scale by, and
    Qwen3.5's value heads tiled."""
    folder, gguf_file, _ = hybrid_gguf
    from_folder = normalized(json.loads((folder / "config.json").read_text()))
    from_gguf = _core.ModelConfig.from_gguf(gguf_file).fields
    tiled = from_folder["architecture"] == "qwen3_5_text"
    assert from_gguf["gated_delta_net"] == from_folder["gated_delta_net"] | {"value_head_order": "tiled" if tiled else "grouped"}
    assert from_gguf | {"gated_delta_net": None} == from_folder | {"pooling": None, "norm_weight_offset": 0.0, "gated_delta_net": None}


def with_vector_shared_expert_gates(source, out):
    """A copy of the GGUF file `source` with each shared-expert gate (`[1, hidden]`) stored as `[hidden]`, as
    llama.cpp's quantizer writes it (ggml drops a tensor's trailing dimensions of 1): its Q4_K_M files of
    Qwen3-Next hold them so."""
    reader = gguf.GGUFReader(source)
    writer = gguf.GGUFWriter(out, reader.get_field(gguf.Keys.General.ARCHITECTURE).contents())
    for field in reader.fields.values():
        if field.name != gguf.Keys.General.ARCHITECTURE and not field.name.startswith("GGUF."):
            sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), field.types[0], sub_type=sub_type)
    for tensor in reader.tensors:
        data = tensor.data.reshape(-1) if tensor.name.endswith("ffn_gate_inp_shexp.weight") else tensor.data
        writer.add_tensor(tensor.name, data, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return out


def test_shared_expert_gates_stored_as_vectors_load(hybrid_gguf):
    folder, gguf_file, want = hybrid_gguf
    if not any(t.name.endswith("ffn_gate_inp_shexp.weight") for t in gguf.GGUFReader(gguf_file).tensors):
        pytest.skip("no shared expert")
    vectors = with_vector_shared_expert_gates(gguf_file, folder.parent / f"{folder.name}-vector-gates.gguf")
    assert {len(t.shape) for t in gguf.GGUFReader(vectors).tensors if t.name.endswith("ffn_gate_inp_shexp.weight")} == {1}
    alone, _, _ = generate(vectors, PROMPTS)
    assert alone == want


def test_a_q8_0_file_runs_as_stored(hybrid_gguf):
    """The converter's Q8_0 blocks (every matrix but the routers), read as they are: quantized activations
    and weights move the logits, but not the next token after these prompts of several tokens (a one-token
    prompt's logits are nearly flat)."""
    folder, _, want = hybrid_gguf
    q8_0_file = convert(folder, folder.parent / f"{folder.name}-q8_0.gguf", outtype="q8_0")
    with rsgl.Engine(str(q8_0_file), threads=2, progress=False) as engine:
        assert engine.get_server_info()["quantization"] == "gguf"
        got = [out["output_ids"][0] for out in engine.generate(input_ids=PROMPTS[1:], sampling_params=GREEDY)]
    assert got == [tokens[0] for tokens in want[1:]]
