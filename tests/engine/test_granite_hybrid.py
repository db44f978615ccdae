"""Granite 4's hybrids (GraniteMoeHybrid), whose Mamba-2 layers keep a recurrent state per sequence beside a few
attention layers, from tiny random checkpoints transformers' own classes wrote (tests/zoo_models.py): one with rope
and experts beside the shared MLP, one without rope ("nope") and with the shared MLP alone. float32 greedy tokens
identical to transformers' for prompts within one 64-token chunk of the scan and across several, alone, batched with
different lengths and split over prefill steps, resuming from the prefix cache's state snapshots; every state slot
free again after."""

from __future__ import annotations

import json

import pytest
import rsgl
from test_hybrid import PROMPTS, check_resuming_from_cached_state, generate, transformers_greedy
from zoo_models import build_family

# Each Mamba-2 layer's state: the convolution's window over x, B and C, and every head's [state][head_dim] state.
MAMBA_LAYERS, HEADS, HEAD_DIM, GROUPS, STATE, CONV = 3, 4, 16, 2, 8, 4
SLOT_BYTES = 4 * MAMBA_LAYERS * ((CONV - 1) * (HEADS * HEAD_DIM + 2 * GROUPS * STATE) + HEADS * STATE * HEAD_DIM)


@pytest.fixture(scope="module", params=["granitemoehybrid", "granitemoehybrid_dense"])
def granite_model(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return path, build_family(request.param, path)


@pytest.fixture(scope="module")
def granite(granite_model):
    path, model = granite_model
    return path, transformers_greedy(model, PROMPTS)


def test_float32_greedy_tokens_match_transformers_alone_and_batched(granite):
    path, want = granite
    alone, batched, info = generate(path, PROMPTS)
    assert alone == want
    assert batched == want
    assert info["state_slot_bytes"] == SLOT_BYTES


def test_prompts_split_over_prefill_steps_continue_their_state(granite):
    path, want = granite
    # 24-token steps: the scan's chunks end mid-prompt and the next step resumes from the state.
    alone, batched, _ = generate(path, PROMPTS, chunked_prefill_size=24)
    assert (alone, batched) == (want, want)


def test_a_second_turn_and_a_shared_few_shot_prefix_resume_from_cached_state(granite_model):
    check_resuming_from_cached_state(*granite_model)


def test_bounded_step_sizes_are_refused(granite, tmp_path):
    path, _ = granite
    config = json.loads((path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "time_step_limit": [0.0, 10.0]}))
    with pytest.raises(rsgl.UnsupportedModelError, match=r"bounds its Mamba-2 step sizes .* rsgl runs them unbounded"):
        rsgl.Engine(str(tmp_path), progress=False)
