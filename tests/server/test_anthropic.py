"""Anthropic's Messages API, with the `anthropic` SDK as the client against the real server on the
default model: messages whole and streamed (the same answer as the chat completion it translates
to), forced tool calls and their results, stop sequences, token counting, and Anthropic's errors."""

from __future__ import annotations

import json

import anthropic
import httpx
import jsonschema
import pytest
from server_helpers import API_KEY, drained, openai_client, running_server
from test_tool_calls import WEATHER

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
# Anthropic's newest SDKs dropped temperature (its newest models ignore it); older clients send it.
GREEDY = {"temperature": 0}
WEATHER_TOOL = {"name": "get_weather", "description": "The weather forecast for a city.", "input_schema": WEATHER}
TIME_TOOL = {
    "name": "get_time",
    "description": "The time in a time zone.",
    "input_schema": {"type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}},
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("anthropic")) as (url, _):
        yield url


def client_of(url: str, api_key: str = API_KEY) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=url, api_key=api_key, max_retries=0)


def test_a_message_answers_as_the_chat_completion_it_translates_to(server: str):
    message = client_of(server).messages.create(model="default", max_tokens=24, extra_body=GREEDY, system="Answer briefly.", messages=QUESTION)
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    [block] = message.content
    assert block.type == "text" and block.text
    assert message.stop_reason in ("end_turn", "max_tokens") and message.usage.output_tokens <= 24
    chat = openai_client(server).chat.completions.create(
        model="default", max_tokens=24, extra_body=GREEDY, messages=[{"role": "system", "content": "Answer briefly."}, *QUESTION]
    )
    assert block.text == chat.choices[0].message.content
    assert (message.usage.input_tokens, message.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    counted = client_of(server).messages.count_tokens(model="default", system="Answer briefly.", messages=QUESTION)
    assert counted.input_tokens == message.usage.input_tokens


def test_a_streamed_message_sends_its_text_in_pieces_and_usage_at_the_end(server: str):
    request = dict(
        model="default", max_tokens=40, extra_body=GREEDY, messages=[{"role": "user", "content": [{"type": "text", "text": "Tell me about Paris."}]}]
    )
    whole = client_of(server).messages.create(**request)
    with client_of(server).messages.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [event.type for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop" and kinds[-2] == "message_delta"
    assert kinds[1] == "content_block_start" and kinds.count("content_block_stop") == 1
    text_deltas = [event for event in events if event.type == "content_block_delta"]
    assert len(text_deltas) > 3
    assert final.content[0].text == "".join(event.delta.text for event in text_deltas) == whole.content[0].text
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)
    assert final.usage.input_tokens == whole.usage.input_tokens > 0


def test_stop_sequences_end_the_message_and_are_named(server: str):
    base = client_of(server).messages.create(model="default", max_tokens=30, extra_body=GREEDY, messages=QUESTION)
    word = base.content[0].text.split()[2]
    message = client_of(server).messages.create(model="default", max_tokens=30, extra_body=GREEDY, messages=QUESTION, stop_sequences=[word])
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", word)
    assert word not in message.content[0].text


def test_output_config_format_is_followed(server: str):
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}}, "required": ["city"]}
    message = client_of(server).messages.create(
        model="default", max_tokens=40, messages=QUESTION, output_config={"format": {"type": "json_schema", "schema": schema}}
    )
    jsonschema.validate(json.loads(message.content[0].text), schema)


@pytest.mark.parametrize("stream", [False, True])
def test_a_forced_tool_call_comes_back_as_tool_use_with_its_input(server: str, stream: bool):
    request = dict(model="default", max_tokens=120, extra_body=GREEDY, messages=QUESTION, tools=[WEATHER_TOOL, TIME_TOOL])
    request["tool_choice"] = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    if stream:
        with client_of(server).messages.stream(**request) as events:
            pieces = [event.delta.partial_json for event in events if event.type == "content_block_delta" and event.delta.type == "input_json_delta"]
            message = events.get_final_message()
        assert len(pieces) > 1  # the input streams as it is generated
        assert json.loads("".join(pieces)) == message.content[-1].input
    else:
        message = client_of(server).messages.create(**request)
    assert message.stop_reason == "tool_use"
    call = message.content[-1]
    assert call.type == "tool_use" and call.name == "get_weather" and call.id.startswith("toolu_")
    jsonschema.validate(call.input, WEATHER)


def test_any_tool_choice_forces_a_call_and_a_tool_result_turn_is_answered(server: str):
    client = client_of(server)
    tools = [WEATHER_TOOL, TIME_TOOL]
    asked = client.messages.create(model="default", max_tokens=120, extra_body=GREEDY, messages=QUESTION, tools=tools, tool_choice={"type": "any"})
    calls = [block for block in asked.content if block.type == "tool_use"]
    assert calls and asked.stop_reason in ("tool_use", "max_tokens")
    results = [{"type": "tool_result", "tool_use_id": call.id, "content": [{"type": "text", "text": '{"ok": true}'}]} for call in calls]
    history = [*QUESTION, {"role": "assistant", "content": [block.model_dump() for block in asked.content]}, {"role": "user", "content": results}]
    answer = client.messages.create(model="default", max_tokens=16, messages=history, tools=tools, tool_choice={"type": "none"})
    assert answer.content and answer.stop_reason in ("end_turn", "max_tokens") and all(block.type == "text" for block in answer.content)


# A 1 x 1 PNG, for a text-only model to refuse.
PNG_SOURCE = {
    "type": "base64",
    "media_type": "image/png",
    "data": "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGP4z8AAAAMBAQDJ/pLvAAAAAElFTkSuQmCC",
}


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ({"messages": QUESTION}, "max_tokens"),
        ({"max_tokens": 8, "messages": []}, "messages"),
        ({"max_tokens": 8, "messages": [{"role": "system", "content": "hi"}]}, "role"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "source"),
        ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "image", "source": PNG_SOURCE}]}]}, "text only"),
        ({"max_tokens": 8, "messages": [*QUESTION, {"role": "assistant", "content": "The"}]}, "prefilled"),
        ({"max_tokens": 8, "messages": QUESTION, "tool_choice": {"type": "tool", "name": "nope"}, "tools": [WEATHER_TOOL]}, "nope"),
        ({"max_tokens": 8, "messages": QUESTION, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "custom tools"),
        ({"max_tokens": 8, "messages": QUESTION, "stop_sequences": "x"}, "stop_sequences"),
        ({"max_tokens": 8, "messages": QUESTION, "thinking": {"type": "sometimes"}}, "thinking"),
        ({"max_tokens": 8, "messages": QUESTION, "output_config": {"format": {"type": "regex"}}}, "output_config"),
    ],
)
def test_bad_requests_get_anthropic_errors(server: str, body: dict, fragment: str):
    response = httpx.post(f"{server}/v1/messages", json={"model": "default", **body}, headers={"x-api-key": API_KEY}, timeout=30)
    assert response.status_code == 400, response.text
    assert response.json()["type"] == "error" and response.json()["error"]["type"] == "invalid_request_error"
    assert fragment in response.json()["error"]["message"]


def test_the_sdk_raises_its_own_errors(server: str):
    with pytest.raises(anthropic.AuthenticationError):
        client_of(server, api_key="wrong").messages.create(model="default", max_tokens=8, messages=QUESTION)
    with pytest.raises(anthropic.NotFoundError, match="does not exist"):
        client_of(server).messages.create(model="claude-unknown", max_tokens=8, messages=QUESTION)
    with pytest.raises(anthropic.BadRequestError):
        client_of(server).messages.create(model="default", max_tokens=8, messages=QUESTION, extra_body={"temperature": -1})
    info = drained(server)
    assert info["running_requests"] == info["waiting_requests"] == info["kv_pages_used"] == 0
