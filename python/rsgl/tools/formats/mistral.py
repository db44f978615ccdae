"""Mistral calls: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]` (SGLang's `mistral`
parser; `[TOOL_CALLS]` is a special token of Mistral's tokenizers)."""

from __future__ import annotations

import orjson

from rsgl._typing import JsonObject
from rsgl.tools.calls import Function, ToolCall, all_parsed, call_schema
from rsgl.tools.formats.base import ToolCallFormat, json_sequence, lark_json, lark_literal

MARKER = "[TOOL_CALLS]"


class MistralFormat(ToolCallFormat):
    name = "mistral"
    markers = (MARKER,)
    markers_anywhere = True
    keeps_special_tokens = True

    def parse_calls(self, text: str) -> list[ToolCall] | None:
        array = text.removeprefix(MARKER).lstrip()
        items, rest = json_sequence(array.removeprefix("["), ",")
        whole = rest.startswith("]") and not rest[1:].strip()
        cut_short = not rest or rest.startswith(",")  # the calls before the one cut short stand
        if not array.startswith("[") or not items or not (whole or cut_short):
            return None
        return all_parsed([ToolCall.from_object(item) for item in items])

    def write(self, calls: list[ToolCall]) -> str:
        return MARKER + " " + orjson.dumps([{"name": call.name, "arguments": orjson.loads(call.arguments)} for call in calls]).decode()

    def constraint(self, functions: list[Function], parallel: bool) -> JsonObject:
        array = {"type": "array", "items": call_schema(functions), "minItems": 1, **({} if parallel else {"maxItems": 1})}
        return {"ebnf": f"start: {lark_literal(MARKER + ' ')} calls\ncalls: {lark_json(array)}\n"}
