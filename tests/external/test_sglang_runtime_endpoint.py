"""SGLang's own frontend against rsgl's server: the `sglang` package (installed without its server
dependencies, see scripts/test.sh) runs SGLang's documented example programs through its
`RuntimeEndpoint` on `python -m rsgl.server`: few-shot with stop, multi-turn chat, fork, select,
regex, JSON, run_batch and streaming. The same program source also runs on rsgl's frontend
(`import rsgl as sgl`) against the same server, and at temperature 0 both give the same text."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema
import pytest
import rsgl
import sglang  # not importorskip: CI installs it, and a missing sglang must fail the run
from server_helpers import API_KEY
from sglang_programs import CAPITAL_SCHEMA, CHARACTER_REGEX, CITIES, IP_REGEX, QUESTIONS, TOOLS, CapitalInfo, define_programs

SGLANG = define_programs(sglang)
RSGL = define_programs(rsgl)


@pytest.fixture(scope="module")
def endpoint(server_url: str) -> sglang.RuntimeEndpoint:
    """SGLang's RuntimeEndpoint as its docs make it: the chat template is picked client-side from
    the model path /get_model_info gives (none of SGLang's patterns matches the default model's
    file, so its plain "default" template)."""
    return sglang.RuntimeEndpoint(server_url, api_key=API_KEY)


@pytest.fixture(scope="module")
def chatml_endpoint(server_url: str) -> sglang.RuntimeEndpoint:
    """RuntimeEndpoint told the model's own chat template by name (SmolLM2's is ChatML)."""
    return sglang.RuntimeEndpoint(server_url, api_key=API_KEY, chat_template_name="chatml")


@pytest.fixture(scope="module")
def native(server_url: str) -> rsgl.RuntimeEndpoint:
    return rsgl.RuntimeEndpoint(server_url, api_key=API_KEY)


def run_both(program: str, endpoint: Any, native: Any, **arguments: Any) -> tuple[Any, Any]:
    """(SGLang's state, rsgl's state) of `program` run with `arguments` on each frontend."""
    sglang_state = getattr(SGLANG, program).run(backend=endpoint, **arguments)
    assert sglang_state.error() is None, sglang_state.error()
    return sglang_state, getattr(RSGL, program).run(backend=native, **arguments)


def test_few_shot_stops_at_the_newline(endpoint, native):
    state, rsgl_state = run_both("few_shot_qa", endpoint, native, question="What is the capital of the United States?")
    answer = state["answer"]
    assert answer.strip() and "\n" not in answer
    assert state.text().endswith("Q: What is the capital of the United States?\nA:" + answer)
    assert state.text() == rsgl_state.text()


def test_multi_turn_chat_with_the_template_sglang_picks(endpoint):
    state = SGLANG.multi_turn_question.run(
        question_1="What is the capital of the United States?", question_2="List two local attractions.", temperature=0, backend=endpoint
    )
    assert state.error() is None, state.error()
    assert [m["role"] for m in state.messages()] == ["system", "user", "assistant", "user", "assistant"]
    assert state.messages()[2]["content"] == state["answer_1"] and state["answer_1"].strip()
    assert state.text().startswith("SYSTEM:You are a helpful assistant.\nUSER:What is the capital of the United States?\nASSISTANT:")


def test_multi_turn_chat_with_the_models_template_matches_rsgl(chatml_endpoint, native):
    state, rsgl_state = run_both(
        "multi_turn_question",
        chatml_endpoint,
        native,
        question_1="What is the capital of the United States?",
        question_2="List two local attractions.",
        temperature=0,
    )
    assert state.text().startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n")
    assert state["answer_1"].strip() and state["answer_2"].strip()
    assert state.text() == rsgl_state.text()


def test_fork_branches_follow_their_own_prompts(endpoint, native):
    state, rsgl_state = run_both("tip_suggestion", endpoint, native, temperature=0)
    text = state.text()
    tip_1, tip_2 = re.fullmatch(r"Here are two tips.*?\n\nTip 1:(.*)\nTip 2:(.*)\nIn summary.*", text, re.DOTALL).groups()
    assert tip_1.strip() and tip_2.strip() and tip_1 != tip_2, "each branch expanded its own tip"
    assert state["summary"]
    assert text == rsgl_state.text()


@pytest.mark.parametrize("program", ["tool_use", "capital"])
def test_select_picks_what_rsgl_picks(endpoint, native, program):
    state, rsgl_state = run_both(program, endpoint, native, **({"question": "What is 12 times 7", "temperature": 0} if program == "tool_use" else {}))
    variable = "tool" if program == "tool_use" else "city"
    choices = TOOLS if program == "tool_use" else CITIES
    assert state[variable] in choices and state[variable] == rsgl_state[variable]
    assert state.text() == rsgl_state.text()
    # SGLang's token-length-normalized choice: the likeliest by its mean prompt log-probability,
    # computed from the input_token_logprobs (with their texts) rsgl's /generate returned.
    scores = state.get_meta_info(variable)["normalized_prompt_logprobs"]
    assert len(scores) == len(choices) and choices[max(range(len(choices)), key=scores.__getitem__)] == state[variable]
    if program == "capital":
        assert state["city"] == " Paris"


def test_sglangs_choice_methods_pick_a_choice(endpoint):
    """Token-length-normalized (the default) and greedy token selection. (Unconditional-likelihood
    normalization needs prompt log-probabilities from position 0 for a request that gives no
    logprob_start_len; SGLang's server, like rsgl's, returns none then, so it fails on both.)"""

    @sglang.function
    def capital(s, method):
        s += "The capital of France is"
        s += sglang.select("city", choices=CITIES, choices_method=method)

    for method in (sglang.token_length_normalized, sglang.greedy_token_selection):
        state = capital.run(method=method, backend=endpoint)
        assert state.error() is None, state.error()
        assert state["city"] in CITIES
        entries = state.get_meta_info("city")["input_token_logprobs"]
        assert all(isinstance(text, str) for entry in entries for _, _, text in entry), "return_text_in_logprobs filled every text"


def test_regex_outputs_match(endpoint, native):
    state, rsgl_state = run_both("regular_expression_gen", endpoint, native)
    assert re.fullmatch(IP_REGEX, state["answer"]) and state.text() == rsgl_state.text()
    state, rsgl_state = run_both("character_gen", endpoint, native, name="Hermione Granger", temperature=0)
    assert re.fullmatch(CHARACTER_REGEX, state["json_output"])
    assert json.loads(state["json_output"])["house"] in ("Gryffindor", "Slytherin", "Ravenclaw", "Hufflepuff")
    assert state.text() == rsgl_state.text()


def test_json_from_a_pydantic_schema_validates(chatml_endpoint, native):
    state, rsgl_state = run_both("json_decode", chatml_endpoint, native, country="France", temperature=0)
    answer = json.loads(state["json_output"])
    jsonschema.validate(answer, CAPITAL_SCHEMA)
    CapitalInfo.model_validate(answer)
    assert state.text() == rsgl_state.text()


def test_typed_gen_constrains_to_an_integer(endpoint):
    @sglang.function
    def count(s):
        s += "Q: How many legs does a spider have?\nA: "
        s += sglang.gen_int("legs", max_tokens=4)

    state = count.run(temperature=0, backend=endpoint)
    assert state.error() is None, state.error()
    assert re.fullmatch(r"-?\d+", state["legs"])


def test_run_batch_answers_each_prompt_as_rsgl_does(endpoint, native):
    batch = [{"question": question} for question in QUESTIONS]
    states = SGLANG.text_qa.run_batch(batch, temperature=0, progress_bar=True, backend=endpoint)
    rsgl_states = RSGL.text_qa.run_batch(batch, temperature=0, backend=native)
    assert [s.error() for s in states] == [None] * len(QUESTIONS)
    assert all(s["answer"].strip() and "\n" not in s["answer"] for s in states)
    assert [s.text() for s in states] == [s.text() for s in rsgl_states]
    for state, question in zip(states, QUESTIONS):
        assert state.text() == f"Q: {question}\nA:" + state["answer"]


def test_streaming_gives_the_same_text_in_pieces(endpoint):
    streamed = SGLANG.text_qa.run(question="What is the capital of France?", temperature=0, stream=True, backend=endpoint)
    pieces = list(streamed.text_iter())
    whole = SGLANG.text_qa.run(question="What is the capital of France?", temperature=0, backend=endpoint)
    assert len(pieces) > 2 and "".join(pieces) == whole.text()
    variable = SGLANG.text_qa.run(question="What is the capital of Japan?", temperature=0, stream=True, backend=endpoint)
    answer_pieces = list(variable.text_iter("answer"))
    assert len(answer_pieces) > 1 and "".join(answer_pieces) == variable["answer"]


def test_server_calls_of_the_frontend(endpoint, http):
    """cache(): a program's constant prefix is prefilled (max_new_tokens 0) and then served from the
    radix cache; flush_cache and get_server_info reach rsgl's endpoints."""
    sglang.flush_cache(endpoint)
    SGLANG.few_shot_qa.cache(backend=endpoint)
    hits_before = http.get("/get_server_info").json()["cache_hit_tokens"]
    state = SGLANG.few_shot_qa.run(question="What is the capital of Spain?", backend=endpoint)
    assert state.get_meta_info("answer")["cached_tokens"] > 0
    assert http.get("/get_server_info").json()["cache_hit_tokens"] > hits_before
    info = sglang.get_server_info(endpoint)
    assert info["radix_cache"] is True and info["running_requests"] == 0


# SGLang's interpreter warns with the traceback of a failed call before the state reports it.
@pytest.mark.filterwarnings("ignore:Error in stream_executor")
def test_what_rsgl_cannot_do_is_refused_with_a_reason(endpoint):
    @sglang.function
    def stop_at_a_digit(s):
        s += "Count: one, two, 3"
        s += sglang.gen("rest", max_tokens=8, stop_regex=r"\d")

    state = stop_at_a_digit.run(backend=endpoint)
    assert "stop_regex is not supported" in str(state.error())
