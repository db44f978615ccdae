"""Llama 3.1+ JSON calls: `{"name": ..., "parameters": {...}}` as the whole answer, after an
optional `<|python_tag|>`, several separated by `;` (SGLang's `llama3` parser)."""

from __future__ import annotations

import orjson

from rsgl._typing import JsonObject
from rsgl.tools.calls import Function, ToolCall, all_parsed, call_schema
from rsgl.tools.formats.base import ToolCallFormat, json_sequence, lark_json
from rsgl.tools.partial_json import PartialCall, call_objects

PYTHON_TAG = "<|python_tag|>"
ARGUMENTS_KEYS = ("parameters", "arguments")


class Llama3Format(ToolCallFormat):
    name = "llama3"
    markers = (PYTHON_TAG, "{")
    markers_anywhere = False

    def parse_calls(self, text: str) -> list[ToolCall] | None:
        values, rest = json_sequence(text.lstrip().removeprefix(PYTHON_TAG), ";")
        if not values or (rest and not rest.startswith(";")):  # a call cut short after a ";" is left out
            return None
        return all_parsed([ToolCall.from_object(value, ARGUMENTS_KEYS) for value in values])

    def partial_calls(self, text: str) -> list[PartialCall]:
        return call_objects(text.lstrip().removeprefix(PYTHON_TAG), 0, ";", ARGUMENTS_KEYS)

    def write(self, calls: list[ToolCall]) -> str:
        return "; ".join(orjson.dumps({"name": call.name, "parameters": orjson.loads(call.arguments)}).decode() for call in calls)

    def constraint(self, functions: list[Function], parallel: bool) -> JsonObject:
        repeat = ' ("; " call)*' if parallel else ""
        return {"ebnf": f"start: call{repeat}\ncall: {lark_json(call_schema(functions, arguments_key='parameters'))}\n"}
