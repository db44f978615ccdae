"""Hybrid models, whose Gated DeltaNet layers keep a recurrent state per sequence beside a few attention layers
(Qwen3.5, Qwen3-Next), from tiny random checkpoints transformers' own classes wrote (tests/zoo_models.py):
float32 greedy tokens identical to transformers' for prompts within one 64-token chunk of the delta rule and
across several, alone, batched with different lengths, split over prefill steps, with fewer state slots than
requests and retracted under a small KV pool; every state slot free again after; what they cannot do yet
(the disk tier, speculative decoding, tensor parallelism) refused with a clear error."""

from __future__ import annotations

import shutil
import time

import pytest
import rsgl
import safetensors.torch
import torch
import transformers
from rsgl.server.__main__ import engine_options as server_engine_options
from rsgl.server.__main__ import parse_args as parse_server_args
from zoo_models import build_family

NEW_TOKENS = 12
# 1 token, one 11-token chunk, two chunks (81), three (150), two again.
PROMPTS = [[1], [1, *range(60, 70)], [1, *range(3, 83)], [1, *range(100, 250)], [1, *range(170, 250)]]
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


def transformers_greedy(model, prompts):
    with torch.no_grad():
        outs = [model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0) for ids in prompts]
    return [out[0, len(ids) :].tolist() for out, ids in zip(outs, prompts)]


@pytest.fixture(scope="module", params=["qwen3_5", "qwen3_next"])
def hybrid_model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return path, build_family(request.param, path)


@pytest.fixture(scope="module")
def hybrid(hybrid_model):
    path, model = hybrid_model
    return path, transformers_greedy(model, PROMPTS)


def generate(path, prompts, **options):
    """Each prompt's greedy tokens alone, then all of them batched; checks that no request holds a state slot or a
    page after (the prefix cache's snapshots and pages are flushed)."""
    with rsgl.Engine(str(path), threads=2, progress=False, dtype="float32", **options) as engine:
        alone = [engine.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"] for ids in prompts]
        batched = [out["output_ids"] for out in engine.generate(input_ids=prompts, sampling_params=GREEDY)]
        info = engine.get_server_info()
        assert info["state_slots_free"] + info["state_snapshots"] == info["state_slots_total"] > 0
        assert engine.flush_cache()
        drained = engine.get_server_info()
    assert drained["state_slots_free"] == drained["state_slots_total"] and drained["state_snapshots"] == 0
    assert drained["kv_pages_free"] == drained["kv_pages_total"]
    return alone, batched, info


def test_float32_greedy_tokens_match_transformers_alone_and_batched(hybrid):
    path, want = hybrid
    alone, batched, info = generate(path, PROMPTS)
    assert alone == want
    assert batched == want
    # One slot holds the convolution window and every value head's matrix of each DeltaNet layer, in float32.
    assert info["state_slot_bytes"] == 4 * 4 * ((4 - 1) * (2 * 2 * 16 + 4 * 8) + 4 * 16 * 8)


def test_prompts_split_over_prefill_steps_continue_their_state(hybrid):
    path, want = hybrid
    # 24-token steps: the delta rule's chunks end mid-prompt and the next step resumes from the state.
    alone, batched, _ = generate(path, PROMPTS, chunked_prefill_size=24)
    assert (alone, batched) == (want, want)


def test_requests_wait_for_a_state_slot_and_retracted_ones_start_over(hybrid):
    path, want = hybrid
    # One slot: the batch runs one request at a time.
    assert generate(path, PROMPTS, max_mamba_cache_size=1)[:2] == (want, want)
    # 45 4-token pages: the two 81-token prompts are admitted together (21 pages each; no pages kept back for
    # their output) and one is retracted as they grow (to 24 each), then resumed from the snapshot its prompt left
    # after 64 tokens.
    pair = [PROMPTS[2], PROMPTS[4]]
    options = {"page_size": 4, "max_total_tokens": 4 * 45, "schedule_conservativeness": 0.0}
    with rsgl.Engine(str(path), threads=2, progress=False, dtype="float32", **options) as engine:
        assert [out["output_ids"] for out in engine.generate(input_ids=pair, sampling_params=GREEDY)] == [want[2], want[4]]
        info = engine.get_server_info()
    assert info["retracted_requests"] > 0


def test_an_aborted_request_gives_its_state_slot_back(hybrid):
    path, _ = hybrid
    with rsgl.Engine(str(path), threads=2, progress=False, dtype="float32") as engine:
        stream = engine.generate(input_ids=PROMPTS[3], sampling_params={**GREEDY, "max_new_tokens": 500}, stream=True)
        next(stream)
        next(stream)  # the statistics of the step that sent the first chunk are out by now
        assert engine.get_server_info()["state_slots_free"] < engine.get_server_info()["state_slots_total"]
        stream.close()  # the caller goes away: the request is aborted
        deadline = time.monotonic() + 30
        while engine.get_server_info()["running_requests"] and time.monotonic() < deadline:
            time.sleep(0.01)
        info = engine.get_server_info()
    assert info["running_requests"] == 0
    assert info["state_slots_free"] + info["state_snapshots"] == info["state_slots_total"]


def check_resuming_from_cached_state(path, model):
    """The prefix cache keeps the recurrent layers' state every 64 tokens (whole pages that end a chunk of the
    recurrence): a conversation's next turn, and a prompt sharing another's long prefix, resume from the last
    snapshot inside what they share, with the tokens transformers gives for their whole prompt, and those of an
    engine without the cache."""
    first = [1, *range(3, 150)]  # 148 tokens: a snapshot after 128
    with rsgl.Engine(str(path), threads=2, progress=False, dtype="float32") as engine:
        answer = engine.generate(input_ids=first, sampling_params=GREEDY)["output_ids"]
        second = [*first, *answer, *range(40, 60)]
        few_shot = [*first[:140], *range(200, 230)]
        outs = [engine.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"] for ids in (second, few_shot)]
        info = engine.get_server_info()
    assert info["cache_hit_tokens"] == 128 + 128  # both resume from the snapshot after 128 tokens
    assert outs == transformers_greedy(model, [second, few_shot])
    with rsgl.Engine(str(path), threads=2, progress=False, dtype="float32", disable_radix_cache=True) as engine:
        assert [engine.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"] for ids in (second, few_shot)] == outs


def test_a_second_turn_and_a_shared_few_shot_prefix_resume_from_cached_state(hybrid_model):
    check_resuming_from_cached_state(*hybrid_model)


@pytest.mark.parametrize(
    "options, refusal",
    [
        ({"hicache_dir": "unused"}, "disk tier"),
        ({"speculative_algorithm": "ngram"}, "rolled back"),
        ({"tp_size": 2}, "tp_size 1"),
    ],
)
def test_what_hybrids_cannot_do_yet_is_refused(hybrid, options, refusal, tmp_path):
    path, _ = hybrid
    if "hicache_dir" in options:
        options = {"hicache_dir": str(tmp_path)}
    with pytest.raises(rsgl.InvalidRequestError, match=refusal):
        rsgl.Engine(str(path), threads=2, progress=False, **options)


def test_a_qwen3_5_vision_language_checkpoint_runs_its_language_model_on_text(tmp_path):
    """Qwen3.5 as the Hub has it: the language model inside a Qwen3_5ForConditionalGeneration (here with a
    one-block vision tower, `model.visual.*`) and multi-token prediction layers (`mtp.*`), neither of which
    rsgl reads yet."""
    text = build_family("qwen3_5", tmp_path / "text")
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64)
    whole = transformers.Qwen3_5ForConditionalGeneration(transformers.Qwen3_5Config(text_config=text.config.to_dict(), vision_config=vision))
    whole.model.language_model.load_state_dict(text.model.state_dict())
    whole.lm_head.load_state_dict(text.lm_head.state_dict())
    whole.save_pretrained(tmp_path / "whole")
    weights = safetensors.torch.load_file(tmp_path / "whole" / "model.safetensors")
    weights["mtp.fc.weight"] = torch.zeros(64, 128)
    safetensors.torch.save_file(weights, tmp_path / "whole" / "model.safetensors", metadata={"format": "pt"})
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tmp_path / "text" / name, tmp_path / "whole" / name)
    prompts = PROMPTS[1:3]
    alone, batched, _ = generate(tmp_path / "whole", prompts)
    assert alone == batched == transformers_greedy(text, prompts)


def test_an_option_added_in_rust_alone_takes_effect_through_the_engine_and_the_server_flag(tmp_path):
    """`mamba_full_memory_ratio`, which only the Rust struct (and its effect) declares: a hybrid
    model's recurrent states get `ratio / (1 + ratio)` of the memory budget, the KV pages the rest."""
    build_family("qwen3_next", tmp_path)
    budget_gb = 0.001
    args = parse_server_args(["--model-path", str(tmp_path), "--threads", "1", "--kv-cache-memory-gb", str(budget_gb), "--mamba-full-memory-ratio", "3"])
    pools = {}
    for ratio in (1.0, server_engine_options(args)["mamba_full_memory_ratio"]):
        options = {**server_engine_options(args), "mamba_full_memory_ratio": ratio}
        with rsgl.Engine(**options, progress=False, dtype="float32") as engine:
            info = engine.get_server_info()
        assert info["state_slots_total"] == int(budget_gb * 2**30 * ratio / (1 + ratio) / info["state_slot_bytes"]), ratio
        pools[ratio] = (info["state_slots_total"], info["kv_pages_total"])
    (slots_half, pages_half), (slots_more, pages_more) = pools[1.0], pools[3.0]
    assert slots_more > slots_half and pages_more < pages_half
