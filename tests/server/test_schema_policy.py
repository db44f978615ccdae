"""JSON schemas with keywords the grammar cannot enforce exactly, through the server: accepted
with warnings (meta_info, a response header), or refused with a 400 in strict mode."""

from __future__ import annotations

import json

import httpx
import jsonschema
import pytest
from server_helpers import AUTH, assert_openai_error, running_server

# oneOf whose branches overlap (an integer is a number), uniqueItems, an unknown format.
SCHEMA = {
    "type": "object",
    "properties": {
        "count": {"oneOf": [{"type": "number"}, {"type": "integer"}]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "uniqueItems": True, "maxItems": 3},
        "home": {"type": "string", "format": "url", "maxLength": 20},
    },
    "required": ["count", "tags", "home"],
    "additionalProperties": False,
}
RELAXED = {("oneOf", "/properties/count"), ("uniqueItems", "/properties/tags"), ("format", "/properties/home")}
# A tree whose named property also falls under a catch-all patternProperties key (llguidance cannot
# intersect the two through the recursive reference), and a patternProperties key with look-ahead.
TREE = {
    "type": "object",
    "properties": {
        "tree": {"$ref": "#/$defs/node"},
        "tags": {"type": "object", "patternProperties": {"^(?!id).+$": {"type": "string"}}, "additionalProperties": False},
    },
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"name": {"type": "string", "maxLength": 8}},
            "patternProperties": {".*": {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/node"}]}},
        }
    },
}
CHAT = {"messages": [{"role": "user", "content": "Give a record."}], "max_tokens": 96, "temperature": 0}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def lenient(tmp_path_factory: pytest.TempPathFactory):
    with running_server(tmp_path_factory.mktemp("lenient")) as (url, _):
        with httpx.Client(base_url=url, headers=AUTH, timeout=120) as http:
            yield http


def relaxed_keywords(warnings: list[dict]) -> set[tuple[str, str]]:
    assert all(w["action"] for w in warnings)
    return {(w["keyword"], w["pointer"]) for w in warnings}


def test_relaxed_schemas_are_accepted_with_warnings_in_meta_info(lenient: httpx.Client):
    body = {"text": "A record:", "sampling_params": {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 96, "temperature": 0}}
    response = lenient.post("/generate", json=body)
    assert response.status_code == 200, response.text
    result = response.json()
    assert relaxed_keywords(result["meta_info"]["json_schema_warnings"]) == RELAXED
    if result["meta_info"]["finish_reason"]["type"] == "stop":
        # What the grammar does enforce holds: types, required, lengths.
        relaxed = {**SCHEMA, "properties": {**SCHEMA["properties"], "count": {"type": "number"}}}
        jsonschema.validate(json.loads(result["text"]), relaxed)


def test_recursive_references_llguidance_cannot_intersect_are_relaxed_with_warnings(lenient: httpx.Client):
    body = {"text": "A tree:", "sampling_params": {"json_schema": json.dumps(TREE), "max_new_tokens": 8, "temperature": 0}}
    response = lenient.post("/generate", json=body)
    assert response.status_code == 200, response.text
    warnings = relaxed_keywords(response.json()["meta_info"]["json_schema_warnings"])
    assert warnings == {("properties", "/$defs/node/properties/name"), ("patternProperties", "/properties/tags")}


def test_openai_answers_carry_the_warnings_in_a_header(lenient: httpx.Client):
    response = lenient.post("/v1/chat/completions", json={**CHAT, "response_format": RESPONSE_FORMAT})
    assert response.status_code == 200, response.text
    assert relaxed_keywords(json.loads(response.headers["x-rsgl-schema-warnings"])) == RELAXED
    plain = lenient.post("/v1/chat/completions", json={**CHAT, "max_tokens": 1})
    assert "x-rsgl-schema-warnings" not in plain.headers


def test_a_request_can_ask_for_strict_mode(lenient: httpx.Client):
    params = {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 8, "strict_json_schema": True}
    message = assert_openai_error(lenient.post("/generate", json={"text": "A record:", "sampling_params": params}), 400)
    assert "`uniqueItems` at /properties/tags" in message and "`format` at /properties/home" in message
    exact = {"type": "object", "properties": {"n": {"oneOf": [{"type": "string"}, {"type": "null"}]}}, "required": ["n"]}
    params = {"json_schema": json.dumps(exact), "max_new_tokens": 8, "strict_json_schema": True}
    response = lenient.post("/generate", json={"text": "A record:", "sampling_params": params})
    assert response.status_code == 200, response.text
    assert "json_schema_warnings" not in response.json()["meta_info"]
    # The same as an extra field of an OpenAI request.
    strict_chat = {**CHAT, "response_format": RESPONSE_FORMAT, "strict_json_schema": True}
    assert "`uniqueItems` at /properties/tags" in assert_openai_error(lenient.post("/v1/chat/completions", json=strict_chat), 400)


def test_strict_servers_refuse_relaxed_schemas_with_a_400(tmp_path: pytest.TempPathFactory):
    with running_server(tmp_path, "--strict-json-schema") as (url, _):
        with httpx.Client(base_url=url, headers=AUTH, timeout=120) as http:
            message = assert_openai_error(http.post("/v1/chat/completions", json={**CHAT, "response_format": RESPONSE_FORMAT}), 400)
            assert "`oneOf` at /properties/count" in message and "strict_json_schema" in message
            # So are forced tool calls whose parameters it would relax.
            tools = {"tools": [{"type": "function", "function": {"name": "record", "parameters": SCHEMA}}], "tool_choice": "required"}
            message = assert_openai_error(http.post("/v1/chat/completions", json={**CHAT, **tools}), 400)
            assert "parameters of record" in message and "`uniqueItems` at /properties/tags" in message
            # A request may still accept the relaxations.
            params = {"json_schema": json.dumps(SCHEMA), "max_new_tokens": 4, "strict_json_schema": False}
            assert http.post("/generate", json={"text": "A record:", "sampling_params": params}).status_code == 200
            lenient_chat = {**CHAT, "max_tokens": 4, "response_format": RESPONSE_FORMAT, "strict_json_schema": False}
            assert http.post("/v1/chat/completions", json=lenient_chat).status_code == 200
