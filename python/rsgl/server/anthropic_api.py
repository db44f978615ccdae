"""Anthropic's Messages API (/v1/messages and /v1/messages/count_tokens), as a translation of its
requests into a chat completion's and of the chat's answer into its content blocks: the same
engine call, tool-call formats and reasoning parsers as /v1/chat/completions."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from rsgl._typing import JsonObject
from rsgl.server.chat_reader import AnswerPart, AnswerParts, ChatReader, whole_answer_parts
from rsgl.server.engine_calls import EngineStream, engine_of, generate_whole
from rsgl.server.errors import ANTHROPIC_PATH, bad_request
from rsgl.server.events import EventDialect, EventStreamResponse
from rsgl.server.native_api import json_response
from rsgl.server.openai_api import EXTRA_SAMPLING_FIELDS, chat_request, check_model, finish_reason_of, text_steps
from rsgl.server.request_body import optional_bool, read_json_object

ROLES = ("user", "assistant")
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}  # and {"type": "tool", "name": ...}
THINKING_TYPES = ("enabled", "disabled", "adaptive", "between_tools")
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "xhigh": "high", "max": "high"}  # to the ones gpt-oss knows
EVENTS = EventDialect(named=True, error=lambda error: error.body(ANTHROPIC_PATH))


# ---- endpoints ----------------------------------------------------------------------------------


async def create_message(request: Request) -> Response:
    body = await read_json_object(request)
    if body.get("max_tokens") is None:
        raise bad_request("max_tokens: Field required", "max_tokens")
    adapter = check_model(body, request)
    call = await chat_request(request, chat_body(body))
    call.arguments["lora_path"] = adapter
    header = {"id": "msg_" + uuid.uuid4().hex, "type": "message", "role": "assistant", "model": engine_of(request).served_model_name}
    stops = body.get("stop_sequences") or []  # checked by chat_body
    if optional_bool(body, "stream"):
        stream = await EngineStream.start(request, call.arguments)
        return EventStreamResponse(message_events(stream, call.chat.reader, header, stops), stream, EVENTS)
    output = await generate_whole(request, call.arguments)
    assert isinstance(output, dict)  # one prompt, one sample
    meta = output["meta_info"]
    reasoning, content, calls = call.chat.reader.fields(output["text"])
    blocks = [content_block(part, part.text) for part in whole_answer_parts(reasoning, content, calls)]
    return json_response({**header, "content": blocks, **stop_fields(meta, bool(calls), stops), "usage": usage(meta)})


async def count_tokens(request: Request) -> Response:
    """The tokens the request's prompt takes (system, messages and tools, as the chat template renders them)."""
    body = await read_json_object(request)
    check_model(body, request)
    call = await chat_request(request, chat_body({**body, "max_tokens": 0}))
    engine = engine_of(request)
    ids = await asyncio.get_running_loop().run_in_executor(None, engine.tokenize, call.chat.prompt)
    return json_response({"input_tokens": len(ids)})


# The media types Anthropic's image blocks carry.
IMAGE_MEDIA_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")

ROUTES = [
    Route(ANTHROPIC_PATH, create_message, methods=["POST"]),
    Route(ANTHROPIC_PATH + "/count_tokens", count_tokens, methods=["POST"]),
]


# ---- the request, as a chat completion's -----------------------------------------------------------


def chat_body(body: JsonObject) -> JsonObject:
    """The chat-completion request that asks what `body` asks; fields both APIs share keep their
    names (temperature, top_p and top_k, which Anthropic's newest SDKs no longer send, are read, as
    are chat's seed, logit_bias, min_p and repetition_penalty)."""
    stop = body.get("stop_sequences")
    if stop is not None and not (isinstance(stop, list) and all(isinstance(s, str) for s in stop)):
        raise bad_request("stop_sequences must be a list of strings", "stop_sequences")
    chat: JsonObject = {
        "messages": [*system_messages(body.get("system")), *chat_messages(body.get("messages"))],
        "max_tokens": body.get("max_tokens"),
        "stop": stop,
        **{name: body.get(name) for name in ("temperature", "top_p", *EXTRA_SAMPLING_FIELDS)},
        **tool_fields(body),
        **output_config(body.get("output_config")),
        "chat_template_kwargs": thinking_kwargs(body.get("thinking")),
    }
    return chat


def system_messages(system: Any) -> list[JsonObject]:
    if system is None:
        return []
    return [{"role": "system", "content": block_text(system, "system")}]


def block_text(content: Any, param: str) -> str:
    """A string, or the text of a list of text blocks (the only blocks a system prompt or tool result holds here)."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str) for block in content):
        return "\n".join(block["text"] for block in content)
    raise bad_request(f"{param} must be a string or a list of text blocks (this server reads text only)", param)


def chat_messages(messages: Any) -> list[JsonObject]:
    if not isinstance(messages, list) or not messages:
        raise bad_request("messages must be a non-empty list", "messages")
    chat = []
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise bad_request(f"{param} must be an object whose role is user or assistant", param)
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list) or not all(isinstance(block, dict) for block in blocks):
            raise bad_request(f"{param}.content must be a string or a list of content blocks", param)
        chat += user_messages(blocks, param) if message["role"] == "user" else [assistant_message(blocks, param)]
    if chat[-1]["role"] == "assistant":
        raise bad_request("the last message must be the user's: this server does not continue a prefilled assistant turn", "messages")
    return chat


def user_messages(blocks: list[JsonObject], param: str) -> list[JsonObject]:
    """A user turn: its tool results (each a tool message, as chat templates take them), then its text and images
    (as chat completions' text and image_url parts)."""
    results, parts = [], []
    for j, block in enumerate(blocks):
        kind, where = block.get("type"), f"{param}.content[{j}]"
        if kind == "text" and isinstance(block.get("text"), str):
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": image_source_url(block.get("source"), f"{where}.source")}})
        elif kind == "tool_result" and isinstance(block.get("tool_use_id"), str):
            result = block_text(block.get("content", ""), f"{where}.content")
            results.append({"role": "tool", "tool_call_id": block["tool_use_id"], "content": ("Error: " + result) if block.get("is_error") else result})
        else:
            raise bad_request(f"{where} must be a text, image or tool_result block, got type {kind!r}", where)
    if any(part["type"] == "image_url" for part in parts):
        return [*results, {"role": "user", "content": parts}]
    return results + ([{"role": "user", "content": "\n".join(part["text"] for part in parts)}] if parts or not results else [])


def image_source_url(source: Any, param: str) -> str:
    """An image block's source as a URL: base64 data as a data: URL, or its url."""
    if isinstance(source, dict) and source.get("type") == "base64" and isinstance(source.get("data"), str):
        media_type = source.get("media_type")
        if media_type not in IMAGE_MEDIA_TYPES:
            raise bad_request(f"{param}.media_type must be one of {', '.join(IMAGE_MEDIA_TYPES)}, got {media_type!r}", f"{param}.media_type")
        return f"data:{media_type};base64,{source['data']}"
    if isinstance(source, dict) and source.get("type") == "url" and isinstance(source.get("url"), str):
        return str(source["url"])
    raise bad_request(f'{param} must be {{"type": "base64", "media_type": ..., "data": ...}} or {{"type": "url", "url": ...}}', param)


def assistant_message(blocks: list[JsonObject], param: str) -> JsonObject:
    texts, reasoning, calls = [], [], []
    for j, block in enumerate(blocks):
        kind, where = block.get("type"), f"{param}.content[{j}]"
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "thinking" and isinstance(block.get("thinking"), str):
            reasoning.append(block["thinking"])
        elif kind == "redacted_thinking":
            continue  # nothing a local model could read
        elif kind == "tool_use" and isinstance(block.get("name"), str) and isinstance(block.get("input"), dict):
            arguments = orjson.dumps(block["input"]).decode()
            calls.append({"id": str(block.get("id", "")), "type": "function", "function": {"name": block["name"], "arguments": arguments}})
        else:
            raise bad_request(f"{where} must be a text, thinking or tool_use block, got type {kind!r}", where)
    message: JsonObject = {"role": "assistant", "content": "".join(texts) or None}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def tool_fields(body: JsonObject) -> JsonObject:
    """`tools` and `tool_choice` as chat completions name them."""
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("tools must be a list", "tools")
    functions = [function_tool(tool, f"tools[{i}]") for i, tool in enumerate(tools or [])]
    choice = body.get("tool_choice")
    if choice is None:
        return {"tools": functions}
    if not isinstance(choice, dict) or choice.get("type") not in (*TOOL_CHOICES, "tool"):
        raise bad_request('tool_choice must be {"type": "auto"}, {"type": "any"}, {"type": "none"} or {"type": "tool", "name": ...}', "tool_choice")
    chosen = {"type": "function", "function": {"name": choice.get("name")}} if choice["type"] == "tool" else TOOL_CHOICES[choice["type"]]
    return {"tools": functions, "tool_choice": chosen, "parallel_tool_calls": not choice.get("disable_parallel_tool_use", False)}


def function_tool(tool: Any, param: str) -> JsonObject:
    if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
        kind = tool.get("type") if isinstance(tool, dict) else None
        raise bad_request(f"{param}: only custom tools (name, description, input_schema) are served here, not {kind!r}", param)
    function = {"name": tool.get("name"), "parameters": tool.get("input_schema")}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def thinking_kwargs(thinking: Any) -> JsonObject:
    """`thinking` as the chat-template variable reasoning models read (Qwen3's `enable_thinking`):
    enabled or disabled; adaptive leaves it to the template's default. A budget is not enforced
    (max_tokens bounds the whole answer)."""
    if thinking is None:
        return {}
    if not isinstance(thinking, dict) or thinking.get("type") not in THINKING_TYPES:
        raise bad_request(f'thinking must be {{"type": ...}} with a type of {", ".join(THINKING_TYPES)}', "thinking")
    return {} if thinking["type"] == "adaptive" else {"enable_thinking": thinking["type"] != "disabled"}


def output_config(config: Any) -> JsonObject:
    """`output_config` as chat's fields: `format` (a JSON schema the answer follows, through the
    grammar) and `effort` (the template's `reasoning_effort`, for gpt-oss; above high is high)."""
    if config is None:
        return {}
    if not isinstance(config, dict):
        raise bad_request('output_config must be an object such as {"format": {"type": "json_schema", "schema": {...}}}', "output_config")
    fields: JsonObject = {}
    form = config.get("format")
    if form is not None:
        if not isinstance(form, dict) or form.get("type") != "json_schema" or not isinstance(form.get("schema"), dict):
            raise bad_request('output_config.format must be {"type": "json_schema", "schema": {...}}', "output_config")
        fields["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": form["schema"]}}
    effort = config.get("effort")
    if effort is not None:
        if effort not in EFFORTS:
            raise bad_request(f"output_config.effort must be one of {', '.join(EFFORTS)}", "output_config")
        fields["reasoning_effort"] = EFFORTS[effort]
    return fields


# ---- the answer, as content blocks -------------------------------------------------------------------


def content_block(part: AnswerPart, text: str) -> JsonObject:
    """The block of an answer's part holding `text` (all of it, or none yet when a stream opens it)."""
    if part.kind == "reasoning":
        return {"type": "thinking", "thinking": text, "signature": ""}
    if part.kind == "text":
        return {"type": "text", "text": text}
    return {"type": "tool_use", "id": "toolu_" + part.call_id.removeprefix("call_"), "name": part.name, "input": orjson.loads(text) if text else {}}


def stop_fields(meta: JsonObject, called: bool, stops: list[str]) -> JsonObject:
    """`stop_reason` (end_turn, max_tokens, stop_sequence or tool_use) and `stop_sequence`."""
    finish = finish_reason_of(meta)  # an aborted request is an error
    matched = meta["finish_reason"].get("matched")
    if finish == "length":
        return {"stop_reason": "max_tokens", "stop_sequence": None}
    if called:
        return {"stop_reason": "tool_use", "stop_sequence": None}
    if isinstance(matched, str) and matched in stops:
        return {"stop_reason": "stop_sequence", "stop_sequence": matched}
    return {"stop_reason": "end_turn", "stop_sequence": None}


def usage(meta: JsonObject) -> JsonObject:
    return {"input_tokens": meta["prompt_tokens"], "output_tokens": meta["completion_tokens"], "cache_read_input_tokens": meta.get("cached_tokens", 0)}


async def message_events(stream: EngineStream, reader: ChatReader, header: JsonObject, stops: list[str]) -> AsyncIterator[JsonObject]:
    """Anthropic's event sequence: message_start, each content block's start, deltas and stop
    (thinking, text, then each tool_use with its input as JSON pieces), message_delta with the stop
    reason and usage, message_stop."""
    deltas = reader.deltas()
    parts = AnswerParts()
    meta: JsonObject = {}
    called = False
    async for step in text_steps(stream):
        if not meta:  # the first step: the prompt's tokens are counted
            started = {**header, "content": [], "stop_reason": None, "stop_sequence": None}
            yield {"type": "message_start", "message": {**started, "usage": usage({**step.chunk["meta_info"], "completion_tokens": 0})}}
        meta = step.chunk["meta_info"]
        choice = deltas.chunk_choice(0, step.new_text, None, step.finish_reason)
        called = called or choice["finish_reason"] == "tool_calls"
        for event in parts.feed(choice["delta"]):
            yield block_event(*event)
    for event in parts.end():
        yield block_event(*event)
    yield {"type": "message_delta", "delta": stop_fields(meta, called, stops), "usage": {"output_tokens": meta.get("completion_tokens", 0)}}
    yield {"type": "message_stop"}


def block_event(action: str, part: AnswerPart, text: str) -> JsonObject:
    if action == "begin":
        return {"type": "content_block_start", "index": part.index, "content_block": content_block(part, "")}
    if action == "add":
        deltas = {"reasoning": ("thinking_delta", "thinking"), "text": ("text_delta", "text"), "call": ("input_json_delta", "partial_json")}
        kind, field = deltas[part.kind]
        return {"type": "content_block_delta", "index": part.index, "delta": {"type": kind, field: text}}
    return {"type": "content_block_stop", "index": part.index}
