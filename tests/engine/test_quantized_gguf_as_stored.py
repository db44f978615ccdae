"""Quantized GGUF files run as they are stored, their blocks on the W4A8 and 8-bit block kernels:
a tiny llama written by gguf-py with random Q4_0, Q4_1, Q8_0 and K-quant blocks (and a type
without integer kernels, run in bfloat16), its prompt log-probabilities against the same file
dequantized to bfloat16."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from loader_helpers import SCALE_OFFSETS, spm_vocabulary


def random_blocks(rng, kind: str, rows: int, cols: int) -> np.ndarray:
    """Random valid blocks of `kind`, [rows, row bytes], with f16 scales that keep the weights
    as small as real ones (K-quants multiply theirs by random 6- or 8-bit sub-block scales)."""
    qtype = gguf.GGMLQuantizationType[kind]
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, size=(rows * cols // block_values, block_bytes), dtype=np.uint8)
    sub_scale = {"Q6_K": 64, "Q4_K": 32, "Q5_K": 32}.get(kind, 1)
    for offset in SCALE_OFFSETS[kind]:
        blocks[:, offset : offset + 2] = (rng.uniform(0.001, 0.004, size=(len(blocks), 1)) / sub_scale).astype(np.float16).view(np.uint8)
    return blocks.reshape(rows, -1)


def quantized_gguf(path: Path, types: dict[str, str]) -> Path:
    """A tiny llama (hidden 256, so K-quant super-blocks fit a row) whose matrices are random
    blocks of the type `types` gives their module (q/k/v/o/gate/up/down/output; default Q4_0)."""
    tokens, scores, token_types = spm_vocabulary()
    hidden, ffn, heads, kv_heads, layers = 256, 512, 4, 2, 2
    head_dim = hidden // heads
    rng = np.random.default_rng(3)
    writer = gguf.GGUFWriter(path, "llama")
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_0)
    for add, value in [
        (writer.add_block_count, layers), (writer.add_context_length, 512), (writer.add_embedding_length, hidden),
        (writer.add_feed_forward_length, ffn), (writer.add_head_count, heads), (writer.add_head_count_kv, kv_heads),
        (writer.add_layer_norm_rms_eps, 1e-5), (writer.add_rope_freq_base, 10000.0), (writer.add_tokenizer_model, "llama"),
        (writer.add_token_list, tokens), (writer.add_token_scores, scores), (writer.add_token_types, token_types),
        (writer.add_bos_token_id, 1), (writer.add_eos_token_id, 2), (writer.add_unk_token_id, 0),
    ]:  # fmt: skip
        add(value)
    vocab = len(tokens)

    def matrix(name: str, module: str, rows: int, cols: int) -> None:
        kind = types.get(module, "Q4_0")
        writer.add_tensor(name, random_blocks(rng, kind, rows, cols), raw_dtype=gguf.GGMLQuantizationType[kind])

    writer.add_tensor("token_embd.weight", (rng.normal(size=(vocab, hidden)) * 0.5).astype(np.float16))
    for layer in range(layers):
        for module, rows, cols in [
            ("attn_q", hidden, hidden), ("attn_k", kv_heads * head_dim, hidden), ("attn_v", kv_heads * head_dim, hidden),
            ("attn_output", hidden, hidden), ("ffn_gate", ffn, hidden), ("ffn_up", ffn, hidden), ("ffn_down", hidden, ffn),
        ]:  # fmt: skip
            matrix(f"blk.{layer}.{module}.weight", module, rows, cols)
        for norm in ("attn_norm", "ffn_norm"):
            writer.add_tensor(f"blk.{layer}.{norm}.weight", np.ones(hidden, dtype=np.float32))
    writer.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    matrix("output.weight", "output", vocab, hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize(
    "types",
    [
        {},  # Q4_0 throughout
        {"attn_q": "Q4_1", "ffn_up": "Q4_1", "output": "Q8_0"},
        # Q4_K_M's mix: a Q6_K v beside Q4_K q and k splits the fused q|k|v.
        {m: "Q4_K" for m in ("attn_q", "attn_k", "attn_output", "ffn_gate", "ffn_up")} | {"attn_v": "Q6_K", "ffn_down": "Q6_K", "output": "Q6_K"},
        {"ffn_down": "Q5_K"},  # a type without integer kernels runs in bfloat16
    ],
    ids=["q4_0", "q4_1+q8_0", "q4_k_m", "q5_k"],
)
def test_quantized_gguf_runs_as_stored(tmp_path, types):
    """The file's blocks as they are against the same file dequantized to bfloat16: the same
    prompt log-probabilities up to rounding (8-bit activations on one side, bf16 weights and
    activations on the other: hundredths here, where a misread block would cost whole units)."""
    import rsgl

    path = quantized_gguf(tmp_path / "quantized.gguf", types)
    ids = [int(i) for i in np.random.default_rng(9).integers(3, 250, size=40)]
    logprobs = {}
    for dtype in ("auto", "bfloat16"):
        with rsgl.Engine(str(path), dtype=dtype, kv_cache_dtype="float32", threads=2, progress=False) as llm:
            assert llm.get_server_info()["quantization"] == ("gguf" if dtype == "auto" else None)
            out = llm.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0}, return_logprob=True, logprob_start_len=0)
            logprobs[dtype] = np.array([lp for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:]])
    assert np.isfinite(logprobs["auto"]).all()
    difference = np.abs(logprobs["auto"] - logprobs["bfloat16"])
    assert difference.mean() < 0.02 and difference.max() < 0.2, difference
