"""OpenAI's Responses API (/v1/responses), as a translation of its requests into a chat
completion's and of the chat's answer into output items (reasoning, message, function calls):
the same engine call, tool-call formats and reasoning parsers as /v1/chat/completions. Stored
responses (`store`, the default) are kept in memory, bounded in count and age, for
`previous_response_id` and `GET /v1/responses/{id}`."""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rsgl._typing import JsonObject
from rsgl.server.chat_reader import AnswerPart, AnswerParts, ChatDeltas, whole_answer_parts
from rsgl.server.engine_calls import EngineStream, engine_of, generate_whole
from rsgl.server.errors import APIError, bad_request
from rsgl.server.events import EventDialect, EventStreamResponse
from rsgl.server.native_api import json_response
from rsgl.server.openai_api import EXTRA_SAMPLING_FIELDS, REASONING_EFFORTS, chat_request, check_model, finish_reason_of, text_steps
from rsgl.server.request_body import optional_bool, optional_dict, optional_int, read_json_object

STORED_RESPONSES = 1000  # the most kept; the oldest goes first
STORED_SECONDS = 3600.0  # how long one is kept
MESSAGE_ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = ("input_text", "output_text", "text")
EVENTS = EventDialect(named=True, error=lambda error: {"type": "error", "code": error.code, "message": error.message, "param": error.param})
# Request fields echoed in the response object, with their defaults.
ECHOED: JsonObject = {
    "instructions": None,
    "max_output_tokens": None,
    "metadata": {},
    "parallel_tool_calls": True,
    "temperature": 1.0,
    "tool_choice": "auto",
    "top_p": 1.0,
}


@dataclass(frozen=True)
class Stored:
    response: JsonObject
    messages: list[JsonObject]  # the conversation in chat messages, this response's answer last, without instructions
    at: float


class ResponseStore:
    """Responses kept for `previous_response_id`: at most `capacity`, each for `seconds`."""

    def __init__(self, capacity: int = STORED_RESPONSES, seconds: float = STORED_SECONDS) -> None:
        self.capacity = capacity
        self.seconds = seconds
        self.items: OrderedDict[str, Stored] = OrderedDict()

    def put(self, response: JsonObject, messages: list[JsonObject]) -> None:
        self.items[response["id"]] = Stored(response, messages, time.monotonic())
        while len(self.items) > self.capacity:
            self.items.popitem(last=False)

    def get(self, response_id: str, param: str | None = None) -> Stored:
        self.expire()
        stored = self.items.get(response_id)
        if stored is None:
            kept = f"responses are kept for {self.seconds:.0f} s, at most {self.capacity} of them"
            raise APIError(404, f"No response with id {response_id!r} is stored here ({kept}; created with store: true).", param=param, code="not_found")
        return stored

    def delete(self, response_id: str) -> None:
        self.get(response_id)
        del self.items[response_id]

    def expire(self) -> None:
        oldest_kept = time.monotonic() - self.seconds
        while self.items and next(iter(self.items.values())).at < oldest_kept:
            self.items.popitem(last=False)


def store_of(request: Request) -> ResponseStore:
    store: ResponseStore = request.app.state.responses
    return store


# ---- endpoints ----------------------------------------------------------------------------------


async def create_response(request: Request) -> Response:
    body = await read_json_object(request)
    adapter = check_model(body, request)
    previous = body.get("previous_response_id")
    if previous is not None and not isinstance(previous, str):
        raise bad_request("previous_response_id must be a string", "previous_response_id")
    history = store_of(request).get(previous, "previous_response_id").messages if previous else []
    conversation = [*history, *input_messages(body.get("input"))]
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("instructions must be a string", "instructions")
    system = [{"role": "system", "content": instructions}] if instructions else []
    call = await chat_request(request, chat_body(body, [*system, *conversation]))
    call.arguments["lora_path"] = adapter
    response = {
        "id": "resp_" + uuid.uuid4().hex,
        "object": "response",
        "created_at": int(time.time()),
        "model": engine_of(request).served_model_name,
        **{name: body.get(name, default) for name, default in ECHOED.items()},
        "previous_response_id": previous,
        "tools": body.get("tools") or [],
        "text": body.get("text") or {"format": {"type": "text"}},
        "reasoning": body.get("reasoning") or {"effort": None, "summary": None},
        "store": optional_bool(body, "store", True),
        "error": None,
    }
    keep = Keep(store_of(request) if response["store"] else None, conversation)
    if optional_bool(body, "stream"):
        stream = await EngineStream.start(request, call.arguments)
        return EventStreamResponse(response_events(stream, call.chat.reader.deltas(), response, keep), stream, EVENTS)
    output = await generate_whole(request, call.arguments)
    assert isinstance(output, dict)  # one prompt, one sample
    parts = whole_answer_parts(*call.chat.reader.fields(output["text"]))
    return json_response(keep(finished(response, parts, output["meta_info"])))


async def get_response(request: Request) -> Response:
    return json_response(store_of(request).get(request.path_params["response_id"]).response)


async def delete_response(request: Request) -> Response:
    response_id = request.path_params["response_id"]
    store_of(request).delete(response_id)
    return json_response({"id": response_id, "object": "response.deleted", "deleted": True})


ROUTES = [
    Route("/v1/responses", create_response, methods=["POST"]),
    Route("/v1/responses/{response_id}", get_response, methods=["GET"]),
    Route("/v1/responses/{response_id}", delete_response, methods=["DELETE"]),
]


# ---- the request, as a chat completion's -----------------------------------------------------------


def chat_body(body: JsonObject, messages: list[JsonObject]) -> JsonObject:
    """The chat-completion request that asks what `body` asks; fields both APIs share keep their
    names (and chat's top_k, min_p, seed, logit_bias and repetition_penalty are read)."""
    chat = {name: body.get(name) for name in ("temperature", "top_p", "parallel_tool_calls", *EXTRA_SAMPLING_FIELDS)}
    effort = optional_dict(body, "reasoning").get("effort")
    if effort is not None and effort not in REASONING_EFFORTS:
        raise bad_request(f"reasoning.effort must be one of {', '.join(REASONING_EFFORTS)}, got {effort!r}", "reasoning")
    return {
        **chat,
        "messages": messages,
        "max_tokens": optional_int(body, "max_output_tokens", minimum=0),
        "tools": [function_tool(tool, f"tools[{i}]") for i, tool in enumerate(list_of(body, "tools"))],
        "tool_choice": tool_choice(body.get("tool_choice")),
        "response_format": text_format(body.get("text")),
        "reasoning_effort": effort,
    }


def list_of(body: JsonObject, name: str) -> list[Any]:
    value = body.get(name) or []
    if not isinstance(value, list):
        raise bad_request(f"{name} must be a list", name)
    return value


def function_tool(tool: Any, param: str) -> JsonObject:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise bad_request(f"{param}: only function tools are served here, not {kind!r}", param)
    return {"type": "function", "function": {key: tool[key] for key in ("name", "description", "parameters") if tool.get(key) is not None}}


def tool_choice(choice: Any) -> Any:
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def text_format(text: Any) -> JsonObject | None:
    """`text.format` as chat's `response_format`: json_schema's name, schema and strict sit one level up here."""
    if text is None:
        return None
    form = text.get("format") if isinstance(text, dict) else None
    if not isinstance(form, dict):
        raise bad_request('text must be an object such as {"format": {"type": "json_schema", "name": ..., "schema": {...}}}', "text")
    if form.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {key: form[key] for key in ("name", "schema", "strict") if key in form}}
    return form


def input_messages(items: Any) -> list[JsonObject]:
    """`input` (a string, or a list of items) as chat messages: function calls join the assistant
    turn before them, and a reasoning item the assistant turn after it."""
    if isinstance(items, str):
        return [{"role": "user", "content": items}]
    if not isinstance(items, list) or not items:
        raise bad_request("input must be a string or a non-empty list of items", "input")
    messages: list[JsonObject] = []
    reasoning: list[str] = []
    for i, item in enumerate(items):
        param = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message" and item.get("role") in MESSAGE_ROLES:
            messages.append({"role": item["role"], "content": item_text(item.get("content"), f"{param}.content")})
        elif kind == "function_call" and all(isinstance(item.get(key), str) for key in ("call_id", "name", "arguments")):
            call = {"id": item["call_id"], "type": "function", "function": {"name": item["name"], "arguments": item["arguments"]}}
            if not messages or messages[-1]["role"] != "assistant":
                messages.append({"role": "assistant", "content": None})
            messages[-1]["tool_calls"] = [*messages[-1].get("tool_calls", []), call]
        elif kind == "function_call_output" and isinstance(item.get("call_id"), str):
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": item_text(item.get("output"), f"{param}.output")})
        elif kind == "reasoning":
            content = item.get("content")
            reasoning += [part["text"] for part in content if isinstance(part, dict) and isinstance(part.get("text"), str)] if isinstance(content, list) else []
            continue
        else:
            raise bad_request(f"{param} must be a message, function_call, function_call_output or reasoning item (this server reads text only)", param)
        if reasoning and messages[-1]["role"] == "assistant":
            messages[-1]["reasoning_content"] = "\n".join(reasoning)
            reasoning = []
    return messages


def item_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) and part.get("type") in TEXT_PARTS and isinstance(part.get("text"), str) for part in content):
        return "".join(part["text"] for part in content)
    raise bad_request(f"{param} must be a string or a list of text parts (this server reads text only)", param)


# ---- the answer, as output items ----------------------------------------------------------------------


ITEM_ID_PREFIXES = {"reasoning": "rs", "text": "msg", "call": "fc"}


def output_item_id(part: AnswerPart, response_id: str) -> str:
    """The response's id and the part's place, so an item streamed and the same item in the final response agree."""
    return f"{ITEM_ID_PREFIXES[part.kind]}_{response_id.removeprefix('resp_')}_{part.index}"


def output_item(part: AnswerPart, response_id: str, status: str = "completed") -> JsonObject:
    """The output item of an answer's part."""
    item_id = output_item_id(part, response_id)
    if part.kind == "reasoning":
        return {"type": "reasoning", "id": item_id, "summary": [], "content": [{"type": "reasoning_text", "text": part.text}], "status": status}
    if part.kind == "text":
        text = {"type": "output_text", "text": part.text, "annotations": [], "logprobs": []}
        return {"type": "message", "id": item_id, "status": status, "role": "assistant", "content": [text]}
    return {"type": "function_call", "id": item_id, "call_id": part.call_id, "name": part.name, "arguments": part.text, "status": status}


def finished(response: JsonObject, parts: list[AnswerPart], meta: JsonObject) -> JsonObject:
    """The response once the answer has ended: its output items, status and usage."""
    cut_short = finish_reason_of(meta) == "length"  # an aborted request is an error
    usage = {
        "input_tokens": meta["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": meta.get("cached_tokens", 0)},
        "output_tokens": meta["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": meta["prompt_tokens"] + meta["completion_tokens"],
    }
    return {
        **response,
        "status": "incomplete" if cut_short else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if cut_short else None,
        "output": [output_item(part, response["id"]) for part in parts],
        "usage": usage,
    }


@dataclass(frozen=True)
class Keep:
    """Stores a finished response (when asked to) with its conversation, its answer as the last turn."""

    store: ResponseStore | None
    conversation: list[JsonObject]

    def __call__(self, response: JsonObject) -> JsonObject:
        if self.store is not None:
            self.store.put(response, [*self.conversation, *input_messages(response["output"])] if response["output"] else self.conversation)
        return response


async def response_events(stream: EngineStream, deltas: ChatDeltas, response: JsonObject, keep: Keep) -> AsyncIterator[JsonObject]:
    """The Responses API's events: response.created and in_progress, each output item's added,
    deltas and done events, then response.completed (or incomplete), each numbered in order."""
    events = ResponseEvents(response["id"])
    yield events.event("response.created", response={**response, "status": "in_progress", "output": []})
    yield events.event("response.in_progress", response={**response, "status": "in_progress", "output": []})
    parts = AnswerParts()
    meta: JsonObject = {}
    async for step in text_steps(stream):
        meta = step.chunk["meta_info"]
        for event in parts.feed(deltas.chunk_choice(0, step.new_text, None, step.finish_reason)["delta"]):
            for payload in events.part_events(*event):
                yield payload
    for event in parts.end():
        for payload in events.part_events(*event):
            yield payload
    final = keep(finished(response, parts.parts, meta))
    yield events.event(f"response.{final['status']}", response=final)


class ResponseEvents:
    """A streamed response's events, numbered in order."""

    def __init__(self, response_id: str) -> None:
        self.response_id = response_id
        self.sequence = 0

    def event(self, kind: str, **fields: Any) -> JsonObject:
        self.sequence += 1
        return {"type": kind, "sequence_number": self.sequence - 1, **fields}

    def part_events(self, action: str, part: AnswerPart, text: str) -> list[JsonObject]:
        where = {"item_id": output_item_id(part, self.response_id), "output_index": part.index}
        text_event = {"reasoning": "response.reasoning_text", "text": "response.output_text", "call": "response.function_call_arguments"}[part.kind]
        if action == "add":  # the part's text so far is not read: an event costs what it adds
            content = {} if part.kind == "call" else {"content_index": 0}
            return [self.event(f"{text_event}.delta", **where, **content, delta=text, **({"logprobs": []} if part.kind == "text" else {}))]
        if action == "begin":
            empty = output_item(AnswerPart(part.kind, part.index, [], part.call_id, part.name), self.response_id, "in_progress")
            added = [self.event("response.output_item.added", output_index=part.index, item=empty)]
            if part.kind == "text":
                added.append(self.event("response.content_part.added", **where, content_index=0, part=content_part("")))
            return added
        if part.kind == "call":
            done = [self.event(f"{text_event}.done", **where, name=part.name, arguments=part.text)]
        else:
            done = [self.event(f"{text_event}.done", **where, content_index=0, text=part.text, **({"logprobs": []} if part.kind == "text" else {}))]
        if part.kind == "text":
            done.append(self.event("response.content_part.done", **where, content_index=0, part=content_part(part.text)))
        return [*done, self.event("response.output_item.done", output_index=part.index, item=output_item(part, self.response_id))]


def content_part(text: str) -> JsonObject:
    return {"type": "output_text", "text": text, "annotations": []}
