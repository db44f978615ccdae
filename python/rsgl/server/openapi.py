"""/openapi.json: an OpenAPI 3 description of every route, generated from the OPERATIONS table.
Schemas are brief: they name the fields and their types; the endpoints check values."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rsgl import __version__
from rsgl._typing import JsonObject
from rsgl.server.native_api import json_response
from rsgl.server.openai_api import CHAT_ROLES

STRING, INTEGER, NUMBER, BOOLEAN = ({"type": kind} for kind in ("string", "integer", "number", "boolean"))


def obj(*required: str, **properties: JsonObject) -> JsonObject:
    return {"type": "object", "properties": properties, **({"required": list(required)} if required else {})}


def array(items: JsonObject) -> JsonObject:
    return {"type": "array", "items": items}


def any_of(*schemas: JsonObject) -> JsonObject:
    # anyOf, not oneOf: the branches overlap ([] is both a list of ids and a list of lists).
    return {"anyOf": list(schemas)}


def nullable(schema: JsonObject) -> JsonObject:
    return {**schema, "nullable": True}


def bounded(kind: JsonObject, minimum: float, maximum: float | None = None, exclusive_minimum: bool = False) -> JsonObject:
    """`kind` within the range the endpoints accept, so generated valid requests are valid."""
    limits = {"minimum": minimum, **({"maximum": maximum} if maximum is not None else {})}
    return {**kind, **limits, **({"exclusiveMinimum": True} if exclusive_minimum else {})}


def typed(kind: JsonObject, names: str) -> JsonObject:
    """{name: kind} for each of the space-separated `names`."""
    return dict.fromkeys(names.split(), kind)


COUNT = bounded(INTEGER, 0)
TOKEN_IDS = array(COUNT)
TOKEN_ID_ROWS = any_of(TOKEN_IDS, array(TOKEN_IDS))
PROMPT_IDS = {**TOKEN_IDS, "minItems": 1}
PROMPT_ID_ROWS = any_of(PROMPT_IDS, {**array(PROMPT_IDS), "minItems": 1})
TEXTS = any_of(STRING, array(STRING))
WORDS = {**STRING, "minLength": 1}
STOP = any_of(WORDS, array(WORDS))
TOP_LOGPROBS = bounded(INTEGER, 0, 20)
ERROR = obj("error", error=obj(message=STRING, type=STRING, param=nullable(STRING), code=nullable(STRING)))
SAMPLING_NUMBERS = {
    "temperature": bounded(NUMBER, 0), "top_p": bounded(NUMBER, 0, 1, exclusive_minimum=True), "min_p": bounded(NUMBER, 0, 1),
    "repetition_penalty": bounded(NUMBER, 0, 2, exclusive_minimum=True),
    "frequency_penalty": bounded(NUMBER, -2, 2), "presence_penalty": bounded(NUMBER, -2, 2),
}  # fmt: skip
SAMPLES = bounded(INTEGER, 1)  # n; the server's --max-n bounds it above
# Token id (a string of digits, below the vocabulary size; OpenAPI 3.0 cannot say so) -> bias added to its logit.
LOGIT_BIAS = {"type": "object", "additionalProperties": bounded(NUMBER, -100, 100)}

SAMPLING_PARAMS = obj(
    **typed(COUNT, "max_new_tokens min_new_tokens seed"), top_k=bounded(INTEGER, -1), n=SAMPLES,
    **typed(BOOLEAN, "ignore_eos skip_special_tokens spaces_between_special_tokens"), **SAMPLING_NUMBERS, stop=STOP, stop_token_ids=TOKEN_IDS,
    logit_bias=LOGIT_BIAS,
)  # fmt: skip
GENERATE_REQUEST = {
    **obj(
        text=TEXTS, input_ids=PROMPT_ID_ROWS, sampling_params=any_of(SAMPLING_PARAMS, array(SAMPLING_PARAMS)), rid=TEXTS,
        **typed(BOOLEAN, "stream return_logprob return_text_in_logprobs"), top_logprobs_num=COUNT,
        lora_path=nullable(any_of(STRING, array(nullable(STRING)))),  # a LoRA adapter's name (of --lora-paths), or one per prompt
    ),
    "oneOf": [{"required": ["text"]}, {"required": ["input_ids"]}],  # exactly one of them
}  # fmt: skip
META_INFO = obj(id=STRING, **typed(INTEGER, "prompt_tokens completion_tokens cached_tokens"), finish_reason=nullable(obj(type=STRING)))
GENERATE_OUTPUT = obj(text=STRING, output_ids=TOKEN_IDS, meta_info=META_INFO)
GENERATE_RESPONSE = any_of(GENERATE_OUTPUT, array(GENERATE_OUTPUT))

OPENAI_FIELDS = {
    "model": STRING, "stop": STOP, "stream_options": obj(include_usage=BOOLEAN), **SAMPLING_NUMBERS,
    **typed(COUNT, "max_tokens seed"), "top_k": bounded(INTEGER, -1), "n": SAMPLES, **typed(BOOLEAN, "ignore_eos stream"),
    "logit_bias": LOGIT_BIAS,
}  # fmt: skip
COMPLETION_REQUEST = obj("prompt", prompt=any_of(WORDS, array(WORDS), PROMPT_ID_ROWS), logprobs=TOP_LOGPROBS, echo=BOOLEAN, **OPENAI_FIELDS)
TEXT_PART = obj("type", "text", type=STRING, text=STRING)
FUNCTION_TYPE = {**STRING, "enum": ["function"]}
# A call's arguments are JSON text of an object (OpenAPI 3.0 cannot say so).
TOOL_CALL = obj("function", id=STRING, type=FUNCTION_TYPE, function=obj("name", "arguments", name=STRING, arguments=STRING))
CHAT_MESSAGE = obj(
    "role", role={**STRING, "enum": list(CHAT_ROLES)}, content=nullable(any_of(STRING, array(TEXT_PART))),
    tool_calls=array(TOOL_CALL), tool_call_id=STRING, name=STRING,
)  # fmt: skip
FUNCTION_NAME = {**STRING, "pattern": "^[A-Za-z0-9_-]{1,64}$"}
# `parameters` is the arguments' JSON schema; with tool_choice "required" or a named function, the grammar engine enforces it.
TOOL = obj("type", "function", type=FUNCTION_TYPE, function=obj("name", name=FUNCTION_NAME, description=STRING, parameters=obj()))
TOOL_CHOICE = any_of({**STRING, "enum": ["none", "auto", "required"]}, obj("type", "function", type=FUNCTION_TYPE, function=obj("name", name=STRING)))
CHAT_REQUEST = obj(
    "messages",
    messages={**array(CHAT_MESSAGE), "minItems": 1},
    max_completion_tokens=COUNT,
    logprobs=BOOLEAN,
    top_logprobs=TOP_LOGPROBS,
    tools=array(TOOL),
    tool_choice=TOOL_CHOICE,
    parallel_tool_calls=BOOLEAN,
    **OPENAI_FIELDS,
)
# reasoning_content: with --reasoning-parser; tool_calls: when the model called tools (finish_reason "tool_calls").
CHAT_ANSWER = obj(role=STRING, content=nullable(STRING), reasoning_content=nullable(STRING), tool_calls=array(TOOL_CALL))
OPENAI_CHOICE = obj(index=INTEGER, finish_reason=nullable(STRING), message=CHAT_ANSWER)
OPENAI_RESPONSE = obj(
    id=STRING, object=STRING, created=INTEGER, model=STRING, choices=array(OPENAI_CHOICE),
    usage=obj(**typed(INTEGER, "prompt_tokens completion_tokens total_tokens")),
)  # fmt: skip

# Anthropic's Messages API (errors in its own shape).
ANTHROPIC_ERROR = obj("type", "error", type=STRING, error=obj("type", "message", type=STRING, message=STRING))
CONTENT_BLOCK = obj(
    "type",
    type={**STRING, "enum": ["text", "thinking", "tool_use", "tool_result"]},
    text=STRING,
    thinking=STRING,
    id=STRING,
    name=STRING,
    input=obj(),
    tool_use_id=STRING,
    content=any_of(STRING, array(TEXT_PART)),
)
MESSAGES_REQUEST = obj(
    "model", "messages", "max_tokens", model=STRING, max_tokens=COUNT, system=any_of(STRING, array(TEXT_PART)),
    messages={**array(obj("role", "content", role={**STRING, "enum": ["user", "assistant"]}, content=any_of(STRING, array(CONTENT_BLOCK)))), "minItems": 1},
    stop_sequences=array(WORDS), temperature=bounded(NUMBER, 0, 1), top_p=SAMPLING_NUMBERS["top_p"], top_k=bounded(INTEGER, -1), stream=BOOLEAN,
    tools=array(obj("name", "input_schema", name=FUNCTION_NAME, description=STRING, input_schema=obj())),
    tool_choice=obj("type", type={**STRING, "enum": ["auto", "any", "tool", "none"]}, name=STRING, disable_parallel_tool_use=BOOLEAN),
    thinking=obj("type", type={**STRING, "enum": ["enabled", "disabled"]}, budget_tokens=COUNT),
)  # fmt: skip
MESSAGE = obj(
    id=STRING, type=STRING, role=STRING, model=STRING, content=array(CONTENT_BLOCK), stop_reason=nullable(STRING), stop_sequence=nullable(STRING),
    usage=obj(**typed(INTEGER, "input_tokens output_tokens cache_read_input_tokens")),
)  # fmt: skip
COUNT_TOKENS_REQUEST = {**MESSAGES_REQUEST, "required": ["model", "messages"]}
# OpenAI's Responses API.
INPUT_ITEM = obj(
    type={**STRING, "enum": ["message", "function_call", "function_call_output", "reasoning"]},
    role={**STRING, "enum": ["user", "assistant", "system", "developer"]},
    content=any_of(STRING, array(obj("type", "text", type={**STRING, "enum": ["input_text", "output_text"]}, text=STRING))),
    **typed(STRING, "call_id name arguments output"),
)  # fmt: skip
RESPONSES_REQUEST = obj(
    "input", model=STRING, input=any_of(WORDS, {**array(INPUT_ITEM), "minItems": 1}), instructions=STRING, max_output_tokens=COUNT,
    temperature=SAMPLING_NUMBERS["temperature"], top_p=SAMPLING_NUMBERS["top_p"], **typed(BOOLEAN, "stream store parallel_tool_calls"),
    previous_response_id=STRING, tools=array(obj("type", "name", type=FUNCTION_TYPE, name=FUNCTION_NAME, description=STRING, parameters=obj())),
    tool_choice=any_of({**STRING, "enum": ["none", "auto", "required"]}, obj("type", "name", type=FUNCTION_TYPE, name=STRING)),
    text=obj(format=obj("type", type={**STRING, "enum": ["text", "json_object", "json_schema"]}, name=STRING, schema=obj(), strict=BOOLEAN)),
    reasoning=obj(effort={**STRING, "enum": ["low", "medium", "high"]}),
)  # fmt: skip
RESPONSE_OBJECT = obj(
    id=STRING, object=STRING, created_at=INTEGER, model=STRING, status=STRING, output=array(obj("type", type=STRING, id=STRING)),
    usage=obj(**typed(INTEGER, "input_tokens output_tokens total_tokens")),
)  # fmt: skip
DELETED = obj(id=STRING, object=STRING, deleted=BOOLEAN)

MODEL_INFO = obj(model_path=STRING, served_model_name=STRING, is_generation=BOOLEAN)
SERVER_INFO = obj(**typed(INTEGER, "running_requests waiting_requests kv_pages_total kv_pages_free cached_pages prompt_tokens generated_tokens"))
LOAD_COUNTS = "dp_rank num_running_reqs num_waiting_reqs num_total_reqs num_used_tokens max_total_num_tokens"
LOAD = obj(**typed(INTEGER, LOAD_COUNTS), token_usage=NUMBER, cache_hit_rate=NUMBER)
LOADS = obj(timestamp=STRING, dp_rank_count=INTEGER, loads=array(LOAD))
# A LoRA adapter's entry names its base model (`parent`).
MODEL_LIST = obj(object=STRING, data=array(obj(id=STRING, object=STRING, created=INTEGER, owned_by=STRING, parent=STRING)))
# SGLang's result of loading or unloading a LoRA adapter: the adapters loaded after it, by name (their folders).
LORA_UPDATE = obj(success=BOOLEAN, error_message=STRING, loaded_adapters={"type": "object", "additionalProperties": STRING})
TOKENIZE_REQUEST = obj(prompt=TEXTS, text=TEXTS)
TOKENIZE_RESPONSE = obj(tokens=TOKEN_ID_ROWS, count=any_of(INTEGER, array(INTEGER)), max_model_len=INTEGER)
DETOKENIZE_REQUEST = obj("tokens", tokens=PROMPT_ID_ROWS, skip_special_tokens=BOOLEAN)
EMBEDDING_INPUT = any_of(WORDS, {**array(WORDS), "minItems": 1}, PROMPT_ID_ROWS)
EMBEDDING_REQUEST = obj(
    "input", input=EMBEDDING_INPUT, model=STRING, encoding_format={**STRING, "enum": ["float", "base64"]}, dimensions=bounded(INTEGER, 1), user=STRING
)
EMBEDDING_RESPONSE = obj(
    object=STRING, model=STRING, usage=obj(**typed(INTEGER, "prompt_tokens total_tokens")),
    data=array(obj(object=STRING, index=INTEGER, embedding=any_of(array(NUMBER), STRING))),
)  # fmt: skip
ENCODE_REQUEST = obj(text=any_of(WORDS, {**array(WORDS), "minItems": 1}), input_ids=PROMPT_ID_ROWS)
ENCODE_OUTPUT = obj(embedding=array(NUMBER), meta_info=META_INFO)
ENCODE_RESPONSE = any_of(ENCODE_OUTPUT, array(ENCODE_OUTPUT))


def as_json(schema: JsonObject) -> JsonObject:
    return {"application/json": schema}


TEXT = {"text/plain": STRING}
# With "stream": true: `data: <json>` events then `data: [DONE]`; Anthropic's and the Responses API's events are named.
SERVER_SENT_EVENTS = {"text/event-stream": STRING}
GENERATE_CONTENT = {**as_json(GENERATE_RESPONSE), **SERVER_SENT_EVENTS}
OPENAI_CONTENT = {**as_json(OPENAI_RESPONSE), **SERVER_SENT_EVENTS}
MESSAGE_CONTENT = {**as_json(MESSAGE), **SERVER_SENT_EVENTS}
RESPONSE_CONTENT = {**as_json(RESPONSE_OBJECT), **SERVER_SENT_EVENTS}


@dataclass(frozen=True)
class Operation:
    method: str
    path: str
    summary: str
    request: JsonObject | None = None  # JSON body schema
    response: JsonObject | None = None  # 200 content: media type -> schema; None for an empty body
    needs_key: bool = True  # when the server runs with --api-key
    anthropic_errors: bool = False  # its errors in Anthropic's shape, not OpenAI's


OPERATIONS = (
    Operation("GET", "/health", "Liveness: 200 while the server runs.", needs_key=False),
    Operation("GET", "/health_generate", "Readiness: 200 when the engine generates a token, 503 otherwise."),
    Operation("GET", "/get_model_info", "The model served.", response=as_json(MODEL_INFO)),
    Operation("GET", "/model_info", "The same as /get_model_info (SGLang's newer name).", response=as_json(MODEL_INFO)),
    Operation("GET", "/get_server_info", "Engine statistics: queues, KV pages, token counts, timings.", response=as_json(SERVER_INFO)),
    Operation("GET", "/server_info", "The same as /get_server_info (SGLang's newer name).", response=as_json(SERVER_INFO)),
    Operation("POST", "/generate", "SGLang: generation, one prompt or a batch.", GENERATE_REQUEST, GENERATE_CONTENT),
    Operation("GET", "/flush_cache", "Empties the prefix cache (400 while requests run).", response=TEXT),
    Operation("POST", "/flush_cache", "Empties the prefix cache (400 while requests run).", response=TEXT),
    Operation("POST", "/tokenize", "The token ids of a text or texts.", TOKENIZE_REQUEST, as_json(TOKENIZE_RESPONSE)),
    Operation("POST", "/detokenize", "The text of token ids.", DETOKENIZE_REQUEST, as_json(obj(text=TEXTS))),
    Operation("POST", "/abort_request", "Aborts the request with this rid.", obj("rid", rid=WORDS)),
    Operation(
        "POST", "/load_lora_adapter", "SGLang: loads a LoRA adapter (a PEFT folder on the server) under a name.",
        obj("lora_name", "lora_path", lora_name=WORDS, lora_path=WORDS), as_json(LORA_UPDATE),
    ),
    Operation(
        "POST", "/unload_lora_adapter", "SGLang: unloads a LoRA adapter (400 while requests use it).", obj("lora_name", lora_name=WORDS), as_json(LORA_UPDATE)
    ),
    Operation("GET", "/metrics", "Prometheus metrics: requests, tokens, latencies, queues, KV usage.", response=TEXT),
    Operation("GET", "/v1/loads", "SGLang: this worker's load, as routers poll it.", response=as_json(LOADS)),
    Operation("GET", "/openapi.json", "This document.", response=as_json(obj(openapi=STRING, paths=obj()))),
    Operation("GET", "/v1/models", "OpenAI: the models served.", response=as_json(MODEL_LIST)),
    Operation("POST", "/v1/completions", "OpenAI: text completion.", COMPLETION_REQUEST, OPENAI_CONTENT),
    Operation("POST", "/v1/chat/completions", "OpenAI: chat completion.", CHAT_REQUEST, OPENAI_CONTENT),
    Operation("POST", "/v1/messages", "Anthropic: a message.", MESSAGES_REQUEST, MESSAGE_CONTENT, anthropic_errors=True),
    Operation(
        "POST", "/v1/messages/count_tokens", "Anthropic: the tokens of a message's prompt.", COUNT_TOKENS_REQUEST, as_json(obj(input_tokens=INTEGER)),
        anthropic_errors=True,
    ),
    Operation("POST", "/v1/responses", "OpenAI Responses: a response, kept for previous_response_id.", RESPONSES_REQUEST, RESPONSE_CONTENT),
    Operation("GET", "/v1/responses/{response_id}", "OpenAI Responses: a stored response.", response=as_json(RESPONSE_OBJECT)),
    Operation("DELETE", "/v1/responses/{response_id}", "OpenAI Responses: deletes a stored response.", response=as_json(DELETED)),
    Operation("POST", "/v1/embeddings", "OpenAI: embeddings (a server started with --is-embedding).", EMBEDDING_REQUEST, as_json(EMBEDDING_RESPONSE)),
    Operation("POST", "/encode", "SGLang: embeddings, one input or a batch (--is-embedding).", ENCODE_REQUEST, as_json(ENCODE_RESPONSE)),
)  # fmt: skip


@functools.cache
def openapi_document() -> JsonObject:
    paths: dict[str, JsonObject] = {}
    for operation in OPERATIONS:
        paths.setdefault(operation.path, {})[operation.method.lower()] = operation_object(operation)
    return {
        "openapi": "3.0.3",
        "info": {"title": "rsgl", "version": __version__, "description": "OpenAI-compatible, Anthropic-compatible and SGLang-native APIs served by rsgl."},
        "paths": paths,
        "components": {"securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}}},  # or x-api-key
        "security": [{"apiKey": []}],  # only enforced when the server runs with --api-key
    }


def operation_object(operation: Operation) -> JsonObject:
    ok: JsonObject = {"description": "OK"}
    if operation.response:
        ok["content"] = {media_type: {"schema": schema} for media_type, schema in operation.response.items()}
    result: JsonObject = {
        "summary": operation.summary,
        "responses": {
            "200": ok,
            "default": {"description": "Error", "content": {"application/json": {"schema": ANTHROPIC_ERROR if operation.anthropic_errors else ERROR}}},
        },
    }
    if names := re.findall(r"{(\w+)}", operation.path):
        result["parameters"] = [{"name": name, "in": "path", "required": True, "schema": STRING} for name in names]
    if operation.request:
        result["requestBody"] = {"required": True, "content": {"application/json": {"schema": operation.request}}}
    if not operation.needs_key:
        result["security"] = []
    return result


async def openapi_json(request: Request) -> Response:
    return json_response(openapi_document())


ROUTES = [Route("/openapi.json", openapi_json, methods=["GET"])]
