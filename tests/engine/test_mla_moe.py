"""DeepSeek-V2 and V3 (multi-head latent attention: the KV cache holds one latent and one rotary key per token, which
every head expands) and GLM-4.5 (grouped-query attention, half the dims rotary, q/k/v biases, per-head q/k norms),
with DeepSeek's mixture of experts (a dense first layer, shared experts beside the routed ones; softmax scores, or
sigmoid ones with a bias choosing the experts; top-k within the best groups; weights renormalized and scaled), from
tiny random checkpoints transformers' own classes wrote (tests/zoo_models.py): float32 greedy tokens identical to
transformers' for prompts of 1, 11 and 81 tokens (past DeepSeek-V2's 64-token YaRN original context), alone and
batched with their prefixes cached, split over 16-token prefill steps, without the prefix cache, from the GGUF file
llama.cpp's converter writes, and with a multi-token prediction layer as the Hub's checkpoints have (which neither
transformers nor rsgl runs); the KV cache's size per token; bfloat16 and int8 KV pages, and W8A8 weights quantized at
load, scoring close to float32's; latent pages evicted to the disk tier and read back."""

from __future__ import annotations

import json

import pytest
import rsgl
import safetensors.torch
import torch
from gguf_convert import convert
from test_hicache import disk_stats, engine, outputs
from test_zoo import MLA_MOE, NEW_TOKENS, PROMPTS, rsgl_greedy, transformers_greedy
from zoo_models import OVERRIDES, build_family

GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
# A GGUF file keeps YaRN's mscale_all_dim alone (as yarn_log_multiplier); llama.cpp takes mscale equal to it, as in
# DeepSeek's released checkpoints (cos and sin then unscaled). So the DeepSeek-V2 file is of such a checkpoint.
GGUF_OVERRIDES = {"deepseek_v2": {"rope_parameters": {**OVERRIDES["deepseek_v2"]["rope_parameters"], "mscale": 0.8}}}
KV_BUDGET_GB = 0.01


@pytest.fixture(scope="module", params=MLA_MOE)
def checkpoint(request, tmp_path_factory):
    """The family, its folder, and transformers' greedy tokens for PROMPTS."""
    path = tmp_path_factory.mktemp(request.param)
    model = build_family(request.param, path)
    return request.param, path, [transformers_greedy(model, ids) for ids in PROMPTS]


@pytest.mark.parametrize("options", [{}, {"chunked_prefill_size": 16}], ids=["whole_prompts", "16_token_prefill_steps"])
def test_float32_greedy_tokens_match_transformers(checkpoint, options):
    _, path, want = checkpoint
    assert rsgl_greedy(path, PROMPTS, dtype="float32", **options) == (want, want)


def test_without_the_prefix_cache(checkpoint):
    _, path, want = checkpoint
    with rsgl.Engine(str(path), dtype="float32", disable_radix_cache=True, threads=1, progress=False) as engine:
        alone = [engine.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"] for ids in PROMPTS]
        batched = [out["output_ids"] for out in engine.generate(input_ids=PROMPTS, sampling_params=GREEDY)]
        assert engine.get_server_info()["cache_hit_tokens"] == 0
    assert alone == batched == want


def test_the_gguf_file_llama_cpps_converter_writes_gives_the_same_tokens(checkpoint, tmp_path):
    name, path, want = checkpoint
    if name in GGUF_OVERRIDES:
        path = tmp_path / name
        model = build_family(name, path, **GGUF_OVERRIDES[name])
        want = [transformers_greedy(model, ids) for ids in PROMPTS]
    gguf_file = convert(path, tmp_path / f"{name}.gguf")
    assert rsgl_greedy(gguf_file, PROMPTS, dtype="float32") == (want, want)


def with_prediction_layer(path) -> None:
    """Appends to the checkpoint at `path` a multi-token prediction layer as DeepSeek-V3 and GLM-4.5 ship one: a
    decoder layer after the last (`model.layers.{n}.*`, here a copy of the last) with its own projection and norms.
    llama.cpp's converter drops it from a DeepSeek GGUF file, and keeps it in a GLM-4.5 one as a last block
    (`blk.{n}.nextn.*`, nextn_predict_layers 1)."""
    config = json.loads((path / "config.json").read_text())
    last, hidden = config["num_hidden_layers"], config["hidden_size"]
    config["num_nextn_predict_layers"] = 1
    (path / "config.json").write_text(json.dumps(config))
    weights = safetensors.torch.load_file(path / "model.safetensors")
    copied = f"model.layers.{last - 1}."
    weights |= {f"model.layers.{last}." + name.removeprefix(copied): w.clone() for name, w in weights.items() if name.startswith(copied)}
    weights[f"model.layers.{last}.eh_proj.weight"] = torch.randn(hidden, 2 * hidden) * 0.1
    weights |= {f"model.layers.{last}.{norm}.weight": torch.ones(hidden) for norm in ("enorm", "hnorm", "shared_head.norm")}
    safetensors.torch.save_file(weights, path / "model.safetensors", metadata={"format": "pt"})


@pytest.mark.parametrize("family", ["deepseek_v3", "glm4_moe"])
def test_a_multi_token_prediction_layer_is_left_out(family, tmp_path):
    model = build_family(family, tmp_path / family)
    with_prediction_layer(tmp_path / family)
    want = [transformers_greedy(model, ids) for ids in PROMPTS[1:]]
    assert rsgl_greedy(tmp_path / family, PROMPTS[1:], dtype="float32") == (want, want)
    gguf_file = convert(tmp_path / family, tmp_path / f"{family}.gguf")
    assert rsgl_greedy(gguf_file, PROMPTS[1:], dtype="float32") == (want, want)


def kv_bytes_per_token(config: dict) -> int:
    """What one token's float32 KV pages hold over all layers: multi-head latent attention's latent and rotary key,
    shared by the heads (not each head's keys and values), or grouped-query attention's keys and values."""
    if "kv_lora_rank" in config:
        per_layer = config["kv_lora_rank"] + config["qk_rope_head_dim"]
    else:
        per_layer = 2 * config["num_key_value_heads"] * config["head_dim"]
    return 4 * config["num_hidden_layers"] * per_layer


def test_the_kv_cache_holds_the_latent_per_token(checkpoint):
    _, path, _ = checkpoint
    config = json.loads((path / "config.json").read_text())
    with rsgl.Engine(str(path), dtype="float32", kv_cache_memory_gb=KV_BUDGET_GB, threads=1, progress=False) as engine:
        info = engine.get_server_info()
    assert abs(info["max_total_tokens"] - KV_BUDGET_GB * 2**30 / kv_bytes_per_token(config)) <= info["page_size"]


def prompt_logprobs(path, **options) -> torch.Tensor:
    """The log-probabilities of PROMPTS[2]'s tokens after the first."""
    with rsgl.Engine(str(path), kv_cache_memory_gb=KV_BUDGET_GB, threads=1, progress=False, **options) as llm:
        out = llm.generate(input_ids=PROMPTS[2], sampling_params={"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
    return torch.tensor([lp for lp, _, _ in out["meta_info"]["input_token_logprobs"][1:]])


@pytest.mark.parametrize(
    "options", [{"kv_cache_dtype": "bfloat16"}, {"kv_cache_dtype": "int8"}, {"quantization": "w8a8_int8"}], ids=["bf16_kv", "int8_kv", "w8a8"]
)
def test_smaller_kv_pages_and_int8_weights_score_a_prompt_alike(checkpoint, options):
    """A prompt's log-probabilities (prefill reads the pages it just wrote) with float32 pages and weights, and with
    smaller pages or W8A8 weights. A rounded latent can flip an expert choice, which moves a few log-probabilities
    far: the bounds are on the median and the mean (transformers with the latent and rotary key so rounded: at most
    0.017 and 0.063). W8A8 also rounds every activation row to 8 bits, which on these 64-wide random layers moves
    them further (DeepSeek-V2's: median 0.053, mean 0.090): twice the bounds."""
    _, path, _ = checkpoint
    diffs = (prompt_logprobs(path, dtype="float32", **options) - prompt_logprobs(path, dtype="float32")).abs()
    slack = 2 if "quantization" in options else 1
    assert diffs.median() < 0.05 * slack and diffs.mean() < 0.2 * slack, (diffs.median(), diffs.mean())
    assert diffs.max() > 0  # the pages or weights really held the smaller type


def test_latent_pages_come_back_from_the_disk_tier(tmp_path_factory):
    """test_hicache's eight prompts over a pool a quarter their size: the second round reads every page back from
    disk, and the outputs stay those of an engine without the tier."""
    path = tmp_path_factory.mktemp("deepseek_v3")
    build_family("deepseek_v3", path)
    with engine(str(path), None, dtype="float32") as llm:
        cold = outputs(llm)
    with engine(str(path), tmp_path_factory.mktemp("disk"), dtype="float32") as llm:
        assert outputs(llm) == cold
        assert outputs(llm) == cold
        assert disk_stats(llm)["hit_tokens"] == llm.get_server_info()["cache_hit_tokens"] > 0
