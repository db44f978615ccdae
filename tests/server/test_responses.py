"""OpenAI's Responses API, with the `openai` SDK as the client against the real server on the
default model: output_text (the chat completion's answer), a streamed response's events in order,
JSON-schema output, a function call and its output fed back, previous_response_id and the store."""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from server_helpers import AUTH, assert_openai_error, drained, openai_client, running_server
from test_tool_calls import WEATHER

QUESTION = "What is the capital of France?"
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "The weather forecast for a city.", "parameters": WEATHER}
CITY = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "country": {"enum": ["France", "Spain"]}},
    "required": ["city", "country"],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("responses")) as (url, _):
        yield url


def test_output_text_is_the_chat_completions_answer(server: str):
    client = openai_client(server)
    response = client.responses.create(model="default", instructions="Answer briefly.", input=QUESTION, max_output_tokens=24, temperature=0)
    assert response.object == "response" and response.id.startswith("resp_") and response.status in ("completed", "incomplete")
    chat = client.chat.completions.create(
        model="default", max_tokens=24, temperature=0, messages=[{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": QUESTION}]
    )
    assert response.output_text == chat.choices[0].message.content
    assert (response.usage.input_tokens, response.usage.output_tokens) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    assert (response.status == "incomplete") == (chat.choices[0].finish_reason == "length")


def test_a_streamed_response_sends_its_events_in_order(server: str):
    client = openai_client(server)
    request = dict(
        model="default", input=[{"role": "user", "content": [{"type": "input_text", "text": "Tell me about Paris."}]}], max_output_tokens=40, temperature=0
    )
    whole = client.responses.create(**request)
    with client.responses.stream(**request) as stream:
        events = list(stream)
    final = events[-1].response  # get_final_response() wants response.completed; a cut-short one ends with response.incomplete
    kinds = [event.type for event in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
    tail = ["response.output_text.done", "response.content_part.done", "response.output_item.done", f"response.{whole.status}"]
    assert kinds[-4:] == tail and set(kinds[4:-4]) == {"response.output_text.delta"} and len(kinds) > 10
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert final.output[0].content[0].text == "".join(event.delta for event in events if event.type == "response.output_text.delta") == whole.output_text


def test_json_schema_output_validates(server: str):
    text = {"format": {"type": "json_schema", "name": "city", "schema": CITY, "strict": True}}
    response = openai_client(server).responses.create(model="default", input=QUESTION, text=text, max_output_tokens=60, temperature=0)
    jsonschema.validate(json.loads(response.output_text), CITY)


@pytest.mark.parametrize("stream", [False, True])
def test_a_function_call_and_its_output_fed_back(server: str, stream: bool):
    client = openai_client(server)
    request = dict(
        model="default",
        input=QUESTION,
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=120,
    )
    if stream:
        with client.responses.stream(**request) as events:
            pieces = [event.delta for event in events if event.type == "response.function_call_arguments.delta"]
            response = events.get_final_response()
        assert len(pieces) > 1 and "".join(pieces) == response.output[-1].arguments  # arguments stream as they are generated
    else:
        response = client.responses.create(**request)
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), WEATHER)
    result = {"type": "function_call_output", "call_id": call.call_id, "output": '{"temperature": 21}'}
    answer = client.responses.create(
        model="default", input=[{"role": "user", "content": QUESTION}, *response.output, result], tools=[WEATHER_TOOL], tool_choice="none", max_output_tokens=12
    )
    assert answer.output and all(item.type == "message" for item in answer.output)


def test_previous_response_id_continues_the_conversation_and_the_store_keeps_it(server: str):
    client = openai_client(server)
    first = client.responses.create(model="default", input="My name is Ann.", max_output_tokens=8, temperature=0)
    second = client.responses.create(model="default", input="What is my name?", previous_response_id=first.id, max_output_tokens=8, temperature=0)
    alone = client.responses.create(model="default", input="What is my name?", max_output_tokens=8, temperature=0, store=False)
    # The first turn is in the second's prompt: its answer, and its question in a turn of its own.
    assert second.usage.input_tokens >= alone.usage.input_tokens + first.usage.output_tokens + len(" My name is Ann.".split()) + 2
    assert second.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output_text == first.output_text
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(alone.id)  # store: false
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="default", input="Hi", previous_response_id="resp_unknown", max_output_tokens=4)
    assert httpx.delete(f"{server}/v1/responses/{first.id}", headers=AUTH).json()["deleted"] is True
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({}, "input"),
        ({"input": []}, "input"),
        ({"input": [{"type": "input_image", "image_url": "x"}]}, "input[0]"),
        ({"input": [{"role": "user", "content": [{"type": "input_image"}]}]}, "input[0].content"),
        ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0]"),
        ({"input": "hi", "text": {"format": "json"}}, "text"),
        ({"input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning"),
        ({"input": "hi", "previous_response_id": 3}, "previous_response_id"),
        ({"input": "hi", "max_output_tokens": -1}, "max_output_tokens"),
    ],
)
def test_bad_requests_get_openai_errors(server: str, body: dict, param: str):
    response = httpx.post(f"{server}/v1/responses", json={"model": "default", **body}, headers=AUTH, timeout=30)
    assert_openai_error(response, 400)
    assert response.json()["error"]["param"] == param
    info = drained(server)
    assert info["running_requests"] == info["kv_pages_used"] == 0
