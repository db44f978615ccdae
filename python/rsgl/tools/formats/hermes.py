"""Hermes / Qwen 2.5+ calls: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`, one
block per call (SGLang's `hermes` and `qwen25` parsers)."""

from __future__ import annotations

import re

import orjson

from rsgl._typing import JsonObject
from rsgl.tools.calls import Function, ToolCall, all_parsed, call_schema
from rsgl.tools.formats.base import ToolCallFormat, json_sequence, lark_json, lark_literal
from rsgl.tools.partial_json import PartialCall, call_object

OPEN, CLOSE = "<tool_call>", "</tool_call>"
# The last block may lack its closing tag when generation stopped right after the JSON.
BLOCK = re.compile(re.escape(OPEN) + r"(.*?)(?:" + re.escape(CLOSE) + r"|\Z)", re.DOTALL)


def block_call(text: str) -> ToolCall | None:
    values, rest = json_sequence(text, "")
    return ToolCall.from_object(values[0]) if len(values) == 1 and not rest else None


class HermesFormat(ToolCallFormat):
    name = "hermes"
    markers = (OPEN,)
    markers_anywhere = True

    def parse_calls(self, text: str) -> list[ToolCall] | None:
        calls = [(block_call(block.group(1)), block.group(0).endswith(CLOSE)) for block in BLOCK.finditer(text)]
        # An unclosed last block that does not parse was cut short (by max_tokens): the calls before it stand.
        if calls and calls[-1] == (None, False):
            calls.pop()
        return all_parsed([call for call, _ in calls])

    def partial_calls(self, text: str) -> list[PartialCall]:
        return [call for block in BLOCK.finditer(text) if (call := call_object(block.group(1), 0, ("arguments",))[0])]

    def write(self, calls: list[ToolCall]) -> str:
        blocks = (orjson.dumps({"name": call.name, "arguments": orjson.loads(call.arguments)}).decode() for call in calls)
        return "\n".join(f"{OPEN}\n{block}\n{CLOSE}" for block in blocks)

    def constraint(self, functions: list[Function], parallel: bool) -> JsonObject:
        repeat = ' ("\\n" call)*' if parallel else ""
        grammar = f"start: call{repeat}\ncall: {lark_literal(OPEN + chr(10))} body {lark_literal(chr(10) + CLOSE)}\nbody: {lark_json(call_schema(functions))}\n"
        return {"ebnf": grammar}
