"""Tool calls and reasoning on /v1/chat/completions, through the `openai` client against real
servers: the default model (whose ChatML template does not render tools, so rsgl describes them)
and a tiny random model whose template does (Qwen-style `<tool_call>` blocks)."""

from __future__ import annotations

import json

import httpx
import jsonschema
import langchain_openai
import pytest
import rsgl
from rsgl._typing import JsonObject
from rsgl.chat_template import render_chat
from rsgl.server.chat_reader import ChatReader
from rsgl.server.reasoning import REASONING_PARSERS, ThinkSplitter
from rsgl.tools import FORMATS, Function, ToolCall, format_for_template, messages_for_template
from rsgl.tools.partial_json import call_object, value_prefix
from server_helpers import API_KEY, AUTH, assert_openai_error, openai_client, running_server
from tiny_models import build_tiny, train_byte_level_tokenizer

WEATHER = {
    "type": "object",
    "properties": {
        # Bounded, so a random model's arguments end within the token budget.
        "city": {"type": "string", "maxLength": 12},
        "unit": {"enum": ["celsius", "fahrenheit"]},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
    },
    "required": ["city", "unit"],
}
TIME = {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET", "PST"]}}, "required": ["zone"]}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "The weather forecast for a city.", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "description": "The time in a time zone.", "parameters": TIME}},
]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
# uniqueItems, which llguidance refuses, and a oneOf it cannot tell disjoint: forced calls take the
# parameters through the schema policy as json_schema does (uniqueItems and oneOf relaxed).
TAGGING = {
    "type": "object",
    "properties": {
        "id": {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 999}, {"type": "number", "minimum": 1000, "maximum": 9999}]},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "uniqueItems": True, "maxItems": 3},
    },
    "required": ["id", "tags"],
}
TAGGING_TOOL = {"type": "function", "function": {"name": "tag", "description": "Tags an item.", "parameters": TAGGING}}
UNCOMPILABLE_TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "strin"}}}}}
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
PAST_CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris", "unit": "celsius"}'}}
HISTORY = [
    *QUESTION,
    {"role": "assistant", "content": None, "tool_calls": [PAST_CALL]},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21}'},
]
# A Qwen-style template that renders tools, past calls and tool results.
TOOLS_TEMPLATE = """{%- if tools %}<|im_start|>system
# Tools
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call a function as <tool_call>{"name": ..., "arguments": ...}</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}{% for call in message.tool_calls or [] %}<tool_call>
{{ {"name": call.function.name, "arguments": call.function.arguments} | tojson }}
</tool_call>{% endfor %}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% if enable_thinking is defined and not enable_thinking %}<think>

</think>

{% endif %}{% endif %}"""


# ---- servers ------------------------------------------------------------------------------------


def save_tiny_tools_model(path, max_position_embeddings: int = 2048) -> str:
    """Saves a tiny random Qwen2 with a byte-level tokenizer and TOOLS_TEMPLATE to `path`."""
    build_tiny("qwen2", path, vocab_size=320, max_position_embeddings=max_position_embeddings)
    tokenizer = train_byte_level_tokenizer()
    tokenizer.add_special_tokens(["<|im_start|>", "<|im_end|>"])
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|im_end|>", "chat_template": TOOLS_TEMPLATE}))
    return str(path)


@pytest.fixture(scope="module")
def tiny_tools_model(tmp_path_factory) -> str:
    return save_tiny_tools_model(tmp_path_factory.mktemp("tiny-tools"))


@pytest.fixture(scope="module")
def default_server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("default")) as (url, _):
        yield url


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory, tiny_tools_model: str):
    with running_server(tmp_path_factory.mktemp("tiny"), "--model-path", tiny_tools_model) as (url, _):
        yield url


@pytest.fixture(scope="module", params=["default", "tiny"])
def server(request) -> str:
    """Each server in turn: the tests that follow hold for both."""
    return request.getfixturevalue(f"{request.param}_server")


# ---- forced calls: parseable, matching the schema, whole and streamed ------------------------------


def assert_valid_calls(calls, names=tuple(SCHEMAS)) -> None:
    assert calls, "no tool calls"
    for call in calls:
        assert call.type == "function" and call.id and call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def assert_finished_with_calls(finish_reason: str, parallel: bool) -> None:
    """One call ends within the budget; parallel calls may go on until max_tokens cuts them short
    (a random model's do), when the calls completed before the cut stand."""
    assert finish_reason in (("tool_calls", "length") if parallel else ("tool_calls",)), finish_reason


def streamed_answer(stream) -> tuple[str, str, list[dict], str | None]:
    """(content, reasoning, calls, finish_reason) of a chat completion stream, calls as OpenAI's
    dicts (with how many deltas brought their arguments)."""
    content, reasoning, calls, finish_reason = "", "", {}, None
    for chunk in stream:
        choice = chunk.choices[0]
        content += choice.delta.content or ""
        reasoning += getattr(choice.delta, "reasoning_content", None) or ""
        for delta in choice.delta.tool_calls or []:
            call = calls.setdefault(delta.index, {"id": delta.id, "type": delta.type, "name": "", "arguments": "", "argument_deltas": 0})
            call["name"] += delta.function.name or ""
            call["arguments"] += delta.function.arguments or ""
            call["argument_deltas"] += bool(delta.function.arguments)
        finish_reason = choice.finish_reason or finish_reason
    return content, reasoning, [calls[i] for i in sorted(calls)], finish_reason


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_time"}}])
@pytest.mark.parametrize("parallel", [False, True])
def test_forced_calls_parse_and_match_the_schema(server: str, tool_choice, parallel: bool):
    client = openai_client(server)
    names = ("get_time",) if isinstance(tool_choice, dict) else tuple(SCHEMAS)
    for seed in range(3):
        answer = client.chat.completions.create(
            model="default", messages=QUESTION, tools=TOOLS, tool_choice=tool_choice, parallel_tool_calls=parallel, max_tokens=120, seed=seed
        )
        choice = answer.choices[0]
        assert_finished_with_calls(choice.finish_reason, parallel)
        assert_valid_calls(choice.message.tool_calls, names)
        assert parallel or len(choice.message.tool_calls) == 1


def test_forced_calls_follow_parameters_the_schema_policy_relaxes(server: str):
    client = openai_client(server)
    answer = client.chat.completions.create(
        model="default", messages=QUESTION, tools=[TAGGING_TOOL], tool_choice="required", parallel_tool_calls=False, max_tokens=120, seed=0
    )
    assert_finished_with_calls(answer.choices[0].finish_reason, parallel=False)
    (call,) = answer.choices[0].message.tool_calls
    # What the grammar does enforce holds: all but uniqueItems (oneOf's branches cannot both match).
    enforced_tags = {k: v for k, v in TAGGING["properties"]["tags"].items() if k != "uniqueItems"}
    jsonschema.validate(json.loads(call.function.arguments), {**TAGGING, "properties": {**TAGGING["properties"], "tags": enforced_tags}})


@pytest.mark.parametrize("tool_choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forced_calls_stream_as_tool_call_deltas(server: str, tool_choice):
    client = openai_client(server)
    stream = client.chat.completions.create(model="default", messages=QUESTION, tools=TOOLS, tool_choice=tool_choice, max_tokens=120, seed=1, stream=True)
    content, _, calls, finish_reason = streamed_answer(stream)
    assert_finished_with_calls(finish_reason, parallel=True)
    assert calls and not content.strip()
    for call in calls:
        assert call["type"] == "function" and call["id"].startswith("call_")
        jsonschema.validate(json.loads(call["arguments"]), SCHEMAS[call["name"]])
    assert all(call["argument_deltas"] > 1 for call in calls), calls  # written as they are generated, not in one piece
    whole = client.chat.completions.create(model="default", messages=QUESTION, tools=TOOLS, tool_choice=tool_choice, max_tokens=120, seed=1)
    assert [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls] == [(c["name"], c["arguments"]) for c in calls]
    # The client's stream helper assembles the same calls, argument deltas and all.
    request = dict(model="default", messages=QUESTION, tools=TOOLS, tool_choice=tool_choice, max_tokens=120, seed=1)
    with client.chat.completions.stream(**request) as stream:
        argument_events = [event for event in stream if event.type == "tool_calls.function.arguments.delta"]
        assembled = stream.current_completion_snapshot.choices[0].message.tool_calls  # get_final_completion refuses "length"
    assert [(c.function.name, c.function.arguments) for c in assembled] == [(c["name"], c["arguments"]) for c in calls]
    assert len(argument_events) > len(calls)


def test_deprecated_functions_answer_with_a_function_call(server: str):
    """OpenAI's `functions` and `function_call` (before tools): one call, in `function_call`,
    streamed in pieces as tool calls are; `function` messages bring the result back."""
    client = openai_client(server)
    request = dict(model="default", messages=QUESTION, functions=[tool["function"] for tool in TOOLS], max_tokens=120, seed=0)
    choice = client.chat.completions.create(**request, function_call={"name": "get_weather"}).choices[0]
    assert choice.finish_reason == "function_call" and choice.message.tool_calls is None
    call = choice.message.function_call
    assert call.name == "get_weather"
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    streamed = [c.choices[0] for c in client.chat.completions.create(**request, function_call={"name": "get_weather"}, stream=True)]
    pieces = [c.delta.function_call for c in streamed if c.delta.function_call]
    assert "".join(p.name or "" for p in pieces) == call.name and "".join(p.arguments or "" for p in pieces) == call.arguments
    assert len(pieces) > 2 and streamed[-1].finish_reason == "function_call"
    history = [
        *QUESTION,
        {"role": "assistant", "content": None, "function_call": call.model_dump()},
        {"role": "function", "name": call.name, "content": '{"t": 21}'},
    ]
    answer = client.chat.completions.create(**{**request, "messages": history, "max_tokens": 8})
    assert answer.choices[0].finish_reason in ("stop", "length", "function_call")
    both = httpx.post(f"{server}/v1/chat/completions", json={**request, "tools": TOOLS}, headers=AUTH)
    assert "functions" in assert_openai_error(both, 400) and both.json()["error"]["param"] == "functions"


def test_auto_answers_with_text_or_calls(server: str):
    client = openai_client(server)
    for seed in range(3):
        choice = client.chat.completions.create(model="default", messages=QUESTION, tools=TOOLS, max_tokens=60, seed=seed).choices[0]
        if choice.message.tool_calls:
            assert choice.finish_reason == "tool_calls"
            assert all(call.function.name in SCHEMAS and isinstance(json.loads(call.function.arguments), dict) for call in choice.message.tool_calls)
        else:
            assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)


def test_none_renders_no_tools(server: str):
    client = openai_client(server)
    with_tools = client.chat.completions.create(model="default", messages=QUESTION, tools=TOOLS, max_tokens=1)
    without = client.chat.completions.create(model="default", messages=QUESTION, tools=TOOLS, tool_choice="none", max_tokens=1)
    plain = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=1)
    assert without.usage.prompt_tokens == plain.usage.prompt_tokens < with_tools.usage.prompt_tokens
    assert without.choices[0].message.tool_calls is None


def test_tool_results_go_back_through_the_template(server: str):
    client = openai_client(server)
    before = client.chat.completions.create(model="default", messages=QUESTION, tools=TOOLS, max_tokens=1).usage.prompt_tokens
    answer = client.chat.completions.create(model="default", messages=HISTORY, tools=TOOLS, max_tokens=8)
    assert answer.usage.prompt_tokens > before


def test_default_model_calls_the_weather_tool(default_server: str):
    """The default model reads the tools rsgl describes for it and picks the fitting one."""
    choice = (
        openai_client(default_server)
        .chat.completions.create(model="default", messages=QUESTION, tools=TOOLS, tool_choice="required", parallel_tool_calls=False, temperature=0)
        .choices[0]
    )
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"


@pytest.fixture(scope="module", params=["llama3", "mistral", "pythonic"])
def parser_server(request, tmp_path_factory, tiny_tools_model: str):
    """The tiny model served with each other --tool-call-parser: the grammar forces that format."""
    options = ("--model-path", tiny_tools_model, "--tool-call-parser", request.param)
    with running_server(tmp_path_factory.mktemp(request.param), *options) as (url, _):
        yield url


def test_each_parser_forces_calls_that_parse(parser_server: str):
    client = openai_client(parser_server)
    request = {"model": "default", "messages": QUESTION, "tools": TOOLS, "tool_choice": "required", "max_tokens": 120, "seed": 0}
    for parallel in (False, True):
        choice = client.chat.completions.create(**request, parallel_tool_calls=parallel).choices[0]
        assert_finished_with_calls(choice.finish_reason, parallel)
        assert_valid_calls(choice.message.tool_calls)
        _, _, streamed, finish_reason = streamed_answer(client.chat.completions.create(**request, parallel_tool_calls=parallel, stream=True))
        assert finish_reason == choice.finish_reason
        assert [(call["name"], call["arguments"]) for call in streamed] == [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]


# ---- reasoning ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reasoning_server(tmp_path_factory, tiny_tools_model: str):
    """With deepseek-r1's parser, output is reasoning until `</think>` (which a random model never writes)."""
    options = ("--model-path", tiny_tools_model, "--reasoning-parser", "deepseek-r1")
    with running_server(tmp_path_factory.mktemp("reasoning"), *options) as (url, _):
        yield url


def test_reasoning_content_whole_and_streamed(reasoning_server: str):
    client = openai_client(reasoning_server)
    request = {"model": "default", "messages": QUESTION, "max_tokens": 12, "seed": 3, "logit_bias": {"2": -100}}
    message = client.chat.completions.create(**request).choices[0].message
    assert message.content == "" and message.reasoning_content
    content, reasoning, calls, finish_reason = streamed_answer(client.chat.completions.create(**request, stream=True))
    assert (content, reasoning, calls, finish_reason) == ("", message.reasoning_content, [], "length")


def test_thinking_turned_off_in_the_template_leaves_the_answer_to_the_grammar(reasoning_server: str):
    # Qwen3's templates close the thinking in the prompt when chat_template_kwargs turn it off:
    # the output is then all answer, constrained from its first token.
    client = openai_client(reasoning_server)
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    request = {"model": "default", "messages": QUESTION, "max_tokens": 12, "seed": 3, "logit_bias": {"2": -100}}
    response_format = {"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}}
    thinking = client.chat.completions.create(**request, response_format=response_format).choices[0]
    assert thinking.message.content == "" and thinking.finish_reason == "length"
    kwargs = {"chat_template_kwargs": {"enable_thinking": False}}
    answer = client.chat.completions.create(**request, response_format=response_format, extra_body=kwargs).choices[0]
    assert not answer.message.reasoning_content and answer.finish_reason == "stop"
    jsonschema.validate(json.loads(answer.message.content), schema)


# ---- bad requests -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields, param",
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_stock"}}}, "tool_choice"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "function", "function": {"parameters": WEATHER}}]}, "tools[0]"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "city"}}]}, "tools[0]"),
        ({"tools": [TOOLS[0], TOOLS[0]]}, "tools"),
        ({"tools": [UNCOMPILABLE_TOOL], "tool_choice": "required"}, "tools"),
        ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tool_choice"),
        ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
        ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"function": {"name": "f", "arguments": "{oops"}}]}]}, "messages[0]"),
    ],
)  # fmt: skip
def test_bad_tool_requests_get_a_400(default_server: str, fields: dict, param: str):
    with httpx.Client(base_url=default_server, headers=AUTH, timeout=60) as http:
        response = http.post("/v1/chat/completions", json={"model": "default", "messages": QUESTION, "max_tokens": 4, **fields})
    assert_openai_error(response, 400)
    assert response.json()["error"]["param"] == param


# ---- LangChain --------------------------------------------------------------------------------------


def test_langchain_bind_tools_round_trip(default_server: str):
    from langchain_core.messages import HumanMessage, ToolMessage

    llm = langchain_openai.ChatOpenAI(base_url=f"{default_server}/v1", api_key=API_KEY, model="default", temperature=0, max_tokens=120)
    with_tools = llm.bind_tools(TOOLS, tool_choice="get_weather", parallel_tool_calls=False)
    question = HumanMessage("What is the weather in Paris?")
    asked = with_tools.invoke([question])
    [call] = asked.tool_calls
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], WEATHER)
    answer = llm.bind_tools(TOOLS).invoke([question, asked, ToolMessage('{"temperature": 21}', tool_call_id=call["id"])])
    assert isinstance(answer.content, str)


# ---- rendering, parsing and reasoning, without a server ------------------------------------------


def test_templates_with_tools_get_them_and_past_calls_as_objects():
    functions = [Function(tool["function"]["name"], tool["function"]["parameters"]) for tool in TOOLS]
    call_format = format_for_template(TOOLS_TEMPLATE)
    assert call_format.name == "hermes"
    messages, tools = messages_for_template(HISTORY, functions, call_format, renders_tools=True)
    prompt = render_chat(TOOLS_TEMPLATE, messages, tools=tools)
    assert '{"name": "get_time"' in prompt.split("</tools>")[0]
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>' in prompt
    assert '<tool_response>\n{"temperature": 21}\n</tool_response>' in prompt


def test_templates_without_tools_get_them_described_by_rsgl():
    functions = [Function("get_weather", WEATHER, "The weather forecast for a city.")]
    messages, tools = messages_for_template(HISTORY, functions, FORMATS["hermes"], renders_tools=False)
    assert tools is None and [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert '"name":"get_weather"' in messages[0]["content"] and "<tool_call>" in messages[0]["content"]
    assert messages[2]["content"] == '<tool_call>\n{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}}\n</tool_call>'
    assert messages[3]["content"] == '<tool_response>\n{"temperature": 21}\n</tool_response>'


# Mistral's named calls, as templates of its v11+ tokenizers render them.
MISTRAL_NAMED = FORMATS["mistral"].for_template("{{ '[TOOL_CALLS]' + call.name + '[ARGS]' + call.arguments }}")
EACH_FORMAT = {**FORMATS, "mistral-named": MISTRAL_NAMED}


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral", "mistral-named", "pythonic", "gpt-oss"])
def test_each_format_reads_back_what_it_writes(name: str):
    call_format = EACH_FORMAT[name]
    calls = [ToolCall("get_weather", '{"city":"Paris","days":[1,true,null]}'), ToolCall("get_time", "{}")]
    written = call_format.write(calls)
    text = "Let me check. " + written if call_format.markers_anywhere else written
    content, parsed = call_format.parse(text)
    assert [(call.name, call.arguments) for call in parsed] == [(call.name, call.arguments) for call in calls]
    assert content == text[: len(text) - len(written)]
    assert call_format.parse("Paris is sunny.") == ("Paris is sunny.", [])
    # Cut short (by max_tokens) inside the second call: the first stands.
    assert [call.name for call in call_format.parse(written[: written.rindex("get_time") + 4])[1]] == ["get_weather"]
    # Streaming holds back exactly what may still become a call.
    for end in range(len(text) + 1):
        assert call_format.content_end(text[:end]) <= len(content)


def streamed_calls(reader: ChatReader, text: str, piece: int) -> tuple[list[JsonObject], str]:
    """(the tool-call deltas, the content) of `text` streamed `piece` characters a chunk."""
    deltas = reader.deltas()
    chunks = [deltas.chunk_choice(0, text[i : i + piece], None, None if i + piece < len(text) else "stop") for i in range(0, len(text), piece)]
    assert chunks[-1]["finish_reason"] == "tool_calls"
    return [d for c in chunks for d in c["delta"].get("tool_calls", [])], "".join(c["delta"].get("content", "") for c in chunks)


@pytest.mark.parametrize("name", ["hermes", "llama3", "mistral", "mistral-named", "pythonic", "gpt-oss"])
def test_each_format_streams_arguments_as_they_are_written(name: str):
    """Streamed, a call's arguments arrive in pieces (pythonic calls: each whole, once written) that
    join into exactly the arguments of the whole answer's call: escapes, numbers and layout as
    the parsed call writes them, even when a chunk ends inside an escape or a number."""
    call_format = EACH_FORMAT[name]
    arguments = '{"city": "Par\\u00e9 \\"x\\" \\ud83d\\ude00",  "days": [1, true, null, -2.5e3], "o": {"a": {}}}'
    written = call_format.write([ToolCall("get_weather", arguments), ToolCall("get_time", "{}")])
    text = ("<|channel|>analysis<|message|>Hmm.<|end|>" if name == "gpt-oss" else "Let me check. " if call_format.markers_anywhere else "") + written
    reader = ChatReader(call_format, REASONING_PARSERS["gpt-oss"]("") if name == "gpt-oss" else None)
    whole = reader.choice(0, text, None, "stop")["message"]["tool_calls"]
    assert [call["function"]["arguments"] for call in whole] == ['{"city":"Paré \\"x\\" 😀","days":[1,true,null,-2500.0],"o":{"a":{}}}', "{}"]
    for piece in (1, 2, 5):
        deltas, content = streamed_calls(reader, text, piece)
        assert content == text[: text.index(written)].removeprefix("<|channel|>analysis<|message|>Hmm.<|end|>")
        joined: dict[int, JsonObject] = {}
        for delta in deltas:
            if delta["index"] not in joined:
                joined[delta["index"]] = {"id": delta["id"], "name": delta["function"]["name"], "arguments": ""}
            joined[delta["index"]]["arguments"] += delta["function"]["arguments"]
        assert [(c["name"], c["arguments"]) for c in joined.values()] == [(c["function"]["name"], c["function"]["arguments"]) for c in whole]
        assert all(c["id"].startswith("call_") for c in joined.values())
        assert len(deltas) == 2 if name == "pythonic" else len(deltas) > 10


def test_partial_json_holds_back_what_may_still_change():
    assert value_prefix('{"a": "x\\u00', 0) == ('{"a":"x', None)  # an escape cut in two
    assert value_prefix('{"a": 12', 0) == ('{"a":', None)  # 12 may become 123 or 12.5
    assert value_prefix('{"a": 1.5e', 0) == ('{"a":', None)
    assert value_prefix('{"a": 12} tail', 0) == ('{"a":12}', 9)
    assert value_prefix('{"a": tru', 0) == ('{"a":', None)
    assert value_prefix('{"a": oops}', 0) == ('{"a":', None)  # not JSON: stops where it begins
    assert value_prefix('{"a": 99999999999999999999999}', 0) == ('{"a":', None)  # beyond what ToolCall.arguments can hold
    assert call_object('{"na\\xme": "f", "arguments": {}}', 0, ("arguments",)) == (None, None)  # a key with a bad escape


@pytest.mark.parametrize(
    "text",
    [
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}',
        '[TOOL_CALLS]get_weather{"city": "Paris"}[TOOL_CALLS]get_time{}',  # without [ARGS]
        '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[CALL_ID]f5g6h7i8j[ARGS]{}',
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}, {"name": "get_time", "arguments": {}}]',
    ],
)
def test_mistral_reads_every_form_its_models_write(text: str):
    for call_format in (FORMATS["mistral"], MISTRAL_NAMED):
        content, calls = call_format.parse("Checking. " + text)
        assert content == "Checking. " and [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"}), ("get_time", {})]
    assert MISTRAL_NAMED.parse("[TOOL_CALLS]get_weather[ARGS]{oops}") == ("[TOOL_CALLS]get_weather[ARGS]{oops}", [])


def test_mistral_named_calls_are_forced_in_their_own_form():
    functions = [Function(tool["function"]["name"], tool["function"]["parameters"]) for tool in TOOLS]
    with rsgl.Engine(threads=2, progress=False) as engine:
        prompt = engine.apply_chat_template(QUESTION)
        for parallel in (False, True):
            out = engine.generate(prompt, {"max_new_tokens": 120, "temperature": 0}, **MISTRAL_NAMED.constraint(functions, parallel))
            assert out["text"].startswith("[TOOL_CALLS]"), out["text"]
            assert_finished_with_calls("length" if out["meta_info"]["finish_reason"]["type"] == "length" else "tool_calls", parallel)
            _, calls = MISTRAL_NAMED.parse(out["text"])
            assert calls and (len(calls) == 1 or parallel), out["text"]
            for call in calls:
                jsonschema.validate(json.loads(call.arguments), SCHEMAS[call.name])


def test_pythonic_calls_read_json_constants_as_forced_calls_write_them():
    [call] = FORMATS["pythonic"].parse("[f(a=true, b=null, c=[1.5])]")[1]
    assert (call.name, call.arguments) == ("f", '{"a":true,"b":null,"c":[1.5]}')


def test_reasoning_splits_off_and_streams_in_order():
    text = "<think>\nThe user wants Paris.</think>\n\nIt is sunny."
    for splitter in (ThinkSplitter(starts_inside=False), REASONING_PARSERS["deepseek-r1"]("...")):
        assert splitter.split(text, finished=True) == ("The user wants Paris.", "It is sunny.")
    assert REASONING_PARSERS["deepseek-r1"]("").split("Hmm.</think>Yes.", True) == ("Hmm.", "Yes.")
    assert REASONING_PARSERS["qwen3"]("").split("Yes.", True) == ("", "Yes.")
    assert REASONING_PARSERS["qwen3"]("<|im_start|>assistant\n<think>\n").split("Hmm.</think>Yes.", True) == ("Hmm.", "Yes.")
    assert REASONING_PARSERS["deepseek-r1"]("<think>\n\n</think>\n\n").split("Yes.", True) == ("", "Yes.")
    deltas = ChatReader(FORMATS["hermes"], ThinkSplitter(starts_inside=False)).deltas()
    answer = text + '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    chunks = [deltas.chunk_choice(0, answer[i : i + 3], None, None if i + 3 < len(answer) else "stop") for i in range(0, len(answer), 3)]
    assert "".join(c["delta"].get("reasoning_content", "") for c in chunks) == "The user wants Paris."
    assert "".join(c["delta"].get("content", "") for c in chunks) == "It is sunny."
    calls = [call for c in chunks for call in c["delta"].get("tool_calls", [])]
    assert chunks[-1]["finish_reason"] == "tool_calls" and [call["function"].get("name") for call in calls][0] == "get_time"
