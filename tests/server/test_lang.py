"""rsgl.lang: the example programs of docs/lang_examples.py on both backends (an in-process Engine
and a real server through RuntimeEndpoint), identical greedy outputs across them, the radix
cache serving a program's second run, streaming, forks and errors."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import httpx
import jsonschema
import pytest
import rsgl
import rsgl as sgl
from rsgl.errors import InvalidRequestError
from rsgl.lang import backends
from server_helpers import API_KEY
from sglang_programs import CAPITAL_SCHEMA, CHARACTER_REGEX, IP_REGEX, QUESTIONS, define_programs

spec = importlib.util.spec_from_file_location("lang_examples", Path(__file__).parents[2] / "docs" / "lang_examples.py")
examples = importlib.util.module_from_spec(spec)
spec.loader.exec_module(examples)


@pytest.fixture(scope="module")
def engine():
    with rsgl.Engine(threads=2, progress=False) as engine:
        yield engine


@pytest.fixture(scope="module")
def backend_of(engine, server_url):
    endpoint = rsgl.RuntimeEndpoint(server_url, api_key=API_KEY)
    return {"engine": backends.EngineBackend(engine), "endpoint": endpoint}.__getitem__


@pytest.fixture(scope="module")
def results(backend_of):
    return {name: examples.run_all(backend_of(name)) for name in ("engine", "endpoint")}


@pytest.mark.parametrize("name", ["engine", "endpoint"])
def test_every_example_gives_the_structure_it_asks_for(results, name):
    out = results[name]
    assert len(out["few_shot_qa"]) == 2 and all(answer.strip() for answer in out["few_shot_qa"])
    assert "Paris" in out["multi_turn_chat"][0] and "Rome" in out["multi_turn_chat"][1]
    assert len(out["tree_of_thought"]["ideas"]) == 3, "the fork joined three branches back"
    assert out["tree_of_thought"]["best"] in ("1", "2", "3")
    jsonschema.validate(out["extract_json"], examples.PERSON_SCHEMA)


def test_greedy_programs_give_the_same_output_on_both_backends(results):
    assert results["engine"] == results["endpoint"]


def server_cache_hits(http: httpx.Client) -> int:
    return http.get("/get_server_info").json()["cache_hit_tokens"]


@pytest.mark.parametrize("name", ["engine", "endpoint"])
def test_running_a_program_again_is_served_from_the_radix_cache(backend_of, engine, http, name):
    hits = (lambda: engine.get_server_info()["cache_hit_tokens"]) if name == "engine" else (lambda: server_cache_hits(http))
    questions = ["What is the largest ocean?", "And the smallest?"]
    examples.multi_turn_chat.run(questions=questions, backend=backend_of(name))
    before = hits()
    again = examples.multi_turn_chat.run(questions=questions, backend=backend_of(name))
    assert hits() > before
    assert again.get_meta_info("answer_0")["cached_tokens"] > 0


@pytest.mark.parametrize("name", ["engine", "endpoint"])
def test_a_variable_streams_as_it_is_generated(backend_of, name):
    state = examples.multi_turn_chat.run(questions=["Tell me about the moon."], backend=backend_of(name), stream=True)
    pieces = list(state.text_iter("answer_0"))
    assert len(pieces) > 1 and "".join(pieces) == state["answer_0"]
    assert state.text().endswith(state["answer_0"] + backend_of(name).role_markers("assistant")[1])


def test_forks_run_in_parallel_and_join_their_variables(backend_of):
    @rsgl.function
    def branches(s):
        s += "Count: 1, 2,"
        forks = s.fork(3)
        forks += rsgl.gen("next", max_tokens=3, temperature=0)
        gathered = forks.join()
        s += " done"
        assert [b["next"] for b in gathered] == [f["next"] for f in forks]

    state = branches.run(backend=backend_of("engine"))
    assert len(state["next"]) == 3 and len(set(state["next"])) == 1, "greedy branches agree"
    assert state.text() == "Count: 1, 2, done", "the parent keeps its own text"


def test_select_picks_the_likeliest_choice(backend_of):
    @rsgl.function
    def capital(s):
        s += "The capital of France is"
        s += rsgl.select("city", choices=[" London", " Paris", " a banana"])

    for name in ("engine", "endpoint"):
        state = capital.run(backend=backend_of(name))
        assert state["city"] == " Paris" and state.text() == "The capital of France is Paris"
        assert state.get_meta_info("city")["index"] == 1


def test_default_backend_and_errors(engine, backend_of):
    @rsgl.function
    def bad_regex(s):
        s += "Hi"
        s += rsgl.gen("x", max_tokens=4, regex="(unclosed")

    for name in ("engine", "endpoint"):
        with pytest.raises(InvalidRequestError, match="regex"):
            bad_regex.run(backend=backend_of(name))
    with pytest.raises(InvalidRequestError, match="backend"):
        examples.few_shot_qa.run(question="Hi?")
    rsgl.set_default_backend(engine)
    try:
        assert examples.few_shot_qa.run(question="What do cows drink?")["answer"].strip()
    finally:
        backends._default_backend = None
    with pytest.raises(InvalidRequestError):
        rsgl.select("x", choices=[])


# ---- SGLang's documented programs (tests/sglang_programs.py) with `import rsgl as sgl` -----------------

PROGRAMS = define_programs(sgl)


@pytest.fixture(scope="module")
def sglang_results(backend_of):
    """Each backend's run of SGLang's documented programs, greedy (run's temperature=0 default)."""

    def run_all(backend) -> dict:
        sgl.set_default_backend(backend)
        try:
            return {
                "few_shot": PROGRAMS.few_shot_qa.run(question="What is the capital of the United States?"),
                "multi_turn": PROGRAMS.multi_turn_question.run(
                    question_1="What is the capital of the United States?", question_2="List two local attractions.", temperature=0
                ),
                "tips": PROGRAMS.tip_suggestion.run(temperature=0),
                "tool": PROGRAMS.tool_use.run(question="What is 12 times 7", temperature=0),
                "regex": PROGRAMS.regular_expression_gen.run(),
                "character": PROGRAMS.character_gen.run(name="Hermione Granger", temperature=0),
                "json": PROGRAMS.json_decode.run(country="France", temperature=0),
                "batch": PROGRAMS.text_qa.run_batch([{"question": question} for question in QUESTIONS], progress_bar=True, temperature=0),
            }
        finally:
            backends._default_backend = None

    return {name: run_all(backend_of(name)) for name in ("engine", "endpoint")}


def test_expressions_concatenate_with_text_in_either_order():
    expression = "Q: " + "x" + sgl.gen("a") + "\n" + sgl.select("b", choices=["y"])
    assert [type(part).__name__ for part in expression.parts] == ["str", "Gen", "str", "Select"]
    assert (sgl.user("hi") + sgl.assistant("yo")).parts == (sgl.user("hi"), sgl.assistant("yo"))
    with pytest.raises(TypeError):
        1 + sgl.gen("a")  # noqa: B018


@pytest.mark.parametrize("name", ["engine", "endpoint"])
def test_sglang_documented_programs_run_unchanged(sglang_results, name):
    out = sglang_results[name]
    few_shot = out["few_shot"]
    assert few_shot["answer"].strip() and few_shot.text().endswith("Q: What is the capital of the United States?\nA:" + few_shot["answer"])

    chat = out["multi_turn"]
    assert [m["role"] for m in chat.messages()] == ["system", "user", "assistant", "user", "assistant"]
    assert chat.messages()[2]["content"] == chat["answer_1"] and chat.messages()[4]["content"] == chat["answer_2"]
    assert chat["answer_1"].strip() and chat["answer_2"].strip()

    tips = out["tips"]
    assert tips.text().startswith("Here are two tips") and "\nTip 2:" in tips.text() and tips["summary"]
    assert "detailed_tip" not in tips.variables(), "branches never joined keep their variables"

    tool = out["tool"]
    assert tool["tool"] in ("calculator", "search engine")
    assert ("expression" in tool.variables()) == (tool["tool"] == "calculator")
    assert f"I need to use a {tool['tool']}. " in tool.text()

    assert re.fullmatch(IP_REGEX, out["regex"]["answer"])
    character = json.loads(out["character"]["json_output"])
    assert re.fullmatch(CHARACTER_REGEX, out["character"]["json_output"]) and character["house"]
    jsonschema.validate(json.loads(out["json"]["json_output"]), CAPITAL_SCHEMA)
    answers = [state["answer"] for state in out["batch"]]
    assert len(answers) == 3 and all(answer.strip() for answer in answers)


def test_sglang_programs_give_the_same_greedy_output_on_both_backends(sglang_results):
    def texts(out: dict) -> dict:
        return {key: [s.text() for s in value] if isinstance(value, list) else value.text() for key, value in out.items()}

    assert texts(sglang_results["engine"]) == texts(sglang_results["endpoint"])


@pytest.mark.parametrize("name", ["engine", "endpoint"])
def test_the_whole_text_streams_without_naming_a_variable(backend_of, name):
    state = PROGRAMS.text_qa.run(question="What is the capital of France?", temperature=0, stream=True, backend=backend_of(name))
    pieces = list(state.text_iter())
    assert len(pieces) > 1 and "".join(pieces) == state.text()
    assert state.text() == "Q: What is the capital of France?\nA:" + state["answer"]
