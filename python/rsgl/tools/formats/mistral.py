"""Mistral calls (SGLang's `mistral` parser; `[TOOL_CALLS]` and `[ARGS]` are special tokens of
Mistral's tokenizers), in either of the two forms its models write:
- a JSON array, `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` (tokenizers before v11:
  Mistral 7B v0.3, Nemo, Small 2409);
- one named call after each marker, `[TOOL_CALLS]name[ARGS]{...}[TOOL_CALLS]name[ARGS]{...}`
  (v11 on: Mistral Small 3.1+, Devstral, Magistral; some write no `[ARGS]`).
Both are read; calls are written and forced in the form the chat template renders."""

from __future__ import annotations

import re

import orjson

from rsgl._typing import JsonObject
from rsgl.tools.calls import Function, ToolCall, all_parsed, call_schema, closed
from rsgl.tools.formats.base import ToolCallFormat, json_sequence, lark_json, lark_literal
from rsgl.tools.partial_json import PartialCall, call_objects, object_prefix

MARKER, ARGS = "[TOOL_CALLS]", "[ARGS]"
# A named call: the function's name, an optional `[CALL_ID]...` (Magistral), `[ARGS]`, the arguments.
NAMED_HEAD = r"\s*([A-Za-z0-9_-]{1,64})(?:\[CALL_ID\][A-Za-z0-9]*)?(?:" + re.escape(ARGS) + r")?\s*"
NAMED_CALL = re.compile(NAMED_HEAD + "(.*)", re.DOTALL)
NAMED_CALL_STARTED = re.compile(NAMED_HEAD + r"(?=\{)")  # its name is whole once its arguments begin


class MistralFormat(ToolCallFormat):
    name = "mistral"
    markers = (MARKER,)
    markers_anywhere = True
    keeps_special_tokens = True

    def __init__(self, named_calls: bool = False) -> None:
        self.named_calls = named_calls  # how calls are written and forced

    def for_template(self, template: str | None) -> MistralFormat:
        return MistralFormat(named_calls=template is not None and ARGS in template)

    def parse_calls(self, text: str) -> list[ToolCall] | None:
        body = text.removeprefix(MARKER).lstrip()
        return parse_array(body) if body.startswith("[") else parse_named(body)

    def partial_calls(self, text: str) -> list[PartialCall]:
        body = text.removeprefix(MARKER).lstrip()
        if body.startswith("["):
            return call_objects(body, 1, ",")
        started = (NAMED_CALL_STARTED.match(segment) for segment in body.split(MARKER))
        return [PartialCall(match.group(1), object_prefix(match.string, match.end())) for match in started if match]

    def write(self, calls: list[ToolCall]) -> str:
        if self.named_calls:
            return "".join(f"{MARKER}{call.name}{ARGS}{call.arguments}" for call in calls)
        return MARKER + " " + orjson.dumps([{"name": call.name, "arguments": orjson.loads(call.arguments)} for call in calls]).decode()

    def constraint(self, functions: list[Function], parallel: bool) -> JsonObject:
        if not self.named_calls:
            array = {"type": "array", "items": call_schema(functions), "minItems": 1, **({} if parallel else {"maxItems": 1})}
            return {"ebnf": f"start: {lark_literal(MARKER + ' ')} calls\ncalls: {lark_json(array)}\n"}
        rules = [f"call: {' | '.join(f'call{i}' for i in range(len(functions)))}"]
        for i, function in enumerate(functions):
            rules += [f"call{i}: {lark_literal(MARKER + function.name + ARGS)} args{i}", f"args{i}: {lark_json(closed(function.parameters))}"]
        return {"ebnf": f"start: call{'+' if parallel else ''}\n" + "\n".join(rules) + "\n"}


def parse_array(array: str) -> list[ToolCall] | None:
    items, rest = json_sequence(array.removeprefix("["), ",")
    whole = rest.startswith("]") and not rest[1:].strip()
    cut_short = not rest or rest.startswith(",")  # the calls before the one cut short stand
    if not items or not (whole or cut_short):
        return None
    return all_parsed([ToolCall.from_object(item) for item in items])


def parse_named(body: str) -> list[ToolCall] | None:
    calls: list[ToolCall | None] = []
    segments = body.split(MARKER)
    for i, segment in enumerate(segments):
        match = NAMED_CALL.fullmatch(segment)
        values, rest = json_sequence(match.group(2), "") if match else ([], "")
        if match and len(values) == 1 and not rest.strip():
            calls.append(ToolCall.of(match.group(1), values[0]))
        elif i == len(segments) - 1 and calls:
            break  # the last call, cut short (by max_tokens): the calls before it stand
        else:
            return None
    return all_parsed(calls)
