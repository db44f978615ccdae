"""rsgl.core_types against the engine: the TypedDicts that type what crosses the binding must
name exactly the keys the Rust core reads and writes. Inputs: the engine refuses an unknown key
and lists the ones it knows; outputs and statistics: every key they carry is declared, and
every declared key shows up."""

from __future__ import annotations

import pytest
import rsgl
from core_keys import declared, known_keys
from loader_helpers import normalized
from rsgl import _core, core_types
from rsgl.loader import Llama3RopeScaling, ModelConfigFields, MoeConfig, load_model


@pytest.fixture(scope="module")
def llm():
    with rsgl.Engine(threads=2, progress=False) as engine:
        yield engine


def test_request_and_sampling_params_keys_are_the_engines(llm):
    with pytest.raises(rsgl.InvalidRequestError) as refused:
        llm._core.submit({"rid": "r", "input_ids": [1], "no_such_key": 1})
    assert known_keys(refused.value) == declared(core_types.GenerateRequest)
    with pytest.raises(rsgl.InvalidRequestError) as refused:
        llm._core.check_grammar({"no_such_key": 1})
    assert known_keys(refused.value) == declared(core_types.SamplingParams)


def test_engine_options_keys_are_the_engines():
    model = load_model(None, progress=False)
    with pytest.raises(rsgl.InvalidRequestError) as refused:
        _core.Engine(model.config, model.open_weights(), {"no_such_option": 1}, model.eos_token_ids)
    assert known_keys(refused.value) == declared(core_types.EngineOptions)


def test_output_keys_are_declared_and_all_appear(llm):
    ids = llm.tokenize("The capital of France is")
    request = {
        "rid": "stub-check",
        "input_ids": ids,
        "sampling_params": {"temperature": 0, "max_new_tokens": 3},
        "return_logprob": True,
        "top_logprobs_num": 2,
        "return_prompt_logits": True,
        "logprob_start_len": 0,
    }
    stream = llm._core.submit(request)
    outputs = []
    while not stream.done:
        out = stream.next(10.0)
        assert out is not None, "no output within 10 s"
        outputs.append(out)
    seen = set().union(*outputs)
    assert seen == declared(core_types.Output) - {"embedding"}  # an embedding engine's: tests/server/test_embeddings.py
    finished = outputs[-1]["finished"]
    assert set(finished) == declared(core_types.Finished)
    assert set(finished["finish_reason"]) <= declared(core_types.FinishReason)
    logprob = outputs[0]["logprobs"][0]
    assert set(logprob) == declared(core_types.TokenLogprob) and set(logprob["top"][0]) == declared(core_types.TopLogprob)


def test_stats_keys_are_declared(llm):
    llm.check_grammar({"regex": "[ab]+"})
    stats = llm._core.stats()
    assert set(stats) == declared(core_types.EngineStats)
    assert set(stats["grammar"]) == declared(core_types.GrammarStats)


def test_model_config_keys_are_the_engines():
    mixtral = {
        "architectures": ["MixtralForCausalLM"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 1,
        "num_attention_heads": 4,
        "vocab_size": 32,
        "max_position_embeddings": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
    }
    config = normalized(mixtral)
    assert set(config) == declared(ModelConfigFields)
    assert set(config["moe"] or {}) == declared(MoeConfig) and set(config["rope_scaling"] or {}) == declared(Llama3RopeScaling)
