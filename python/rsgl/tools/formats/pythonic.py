"""Pythonic calls: `[get_weather(city="Paris"), get_time()]` as the whole answer (SGLang's
`pythonic` parser; Llama 3.2 / 4 and others). Values are Python literals; JSON's true, false and
null are read too, since forced calls write each value as JSON."""

from __future__ import annotations

import ast
import re

import orjson

from rsgl._typing import JsonObject
from rsgl.tools.calls import Function, ToolCall, all_parsed
from rsgl.tools.formats.base import ToolCallFormat, lark_json, lark_literal

CALL_END = re.compile(r"\)\s*,")  # where a call in the list ends and another begins
JSON_CONSTANTS = {"true": True, "false": False, "null": None}


class PythonicFormat(ToolCallFormat):
    name = "pythonic"
    markers = ("[",)
    markers_anywhere = False

    def parse_calls(self, text: str) -> list[ToolCall] | None:
        text = text.strip()
        # A list cut short (by max_tokens) keeps the calls before the one cut.
        cut_lists = [] if text.endswith("]") else [text[: m.start() + 1] + "]" for m in reversed(list(CALL_END.finditer(text)))]
        return next((calls for candidate in [text, *cut_lists] if (calls := calls_in(candidate)) is not None), None)

    def write(self, calls: list[ToolCall]) -> str:
        written = (f"{call.name}({', '.join(f'{key}={value!r}' for key, value in orjson.loads(call.arguments).items())})" for call in calls)
        return "[" + ", ".join(written) + "]"

    def constraint(self, functions: list[Function], parallel: bool) -> JsonObject:
        repeat = ' (", " call)*' if parallel else ""
        rules = [f'start: "[" call{repeat} "]"', "call: " + " | ".join(f"f{i}" for i in range(len(functions)))]
        for i, function in enumerate(functions):
            properties = function.parameters.get("properties", {})
            required = set(function.parameters.get("required", []))
            items = [(f"f{i}_{j}", name in required) for j, name in enumerate(properties)]
            rules += [f"f{i}_{j}: {lark_literal(name + '=')} {lark_json(schema)}" for j, (name, schema) in enumerate(properties.items())]
            arguments, may_be_empty = arguments_rule(items)
            call = f"{lark_literal(function.name + '(')} {f'({arguments})?' if may_be_empty and arguments else arguments} {lark_literal(')')}"
            rules.append(f"f{i}: {call}")
        return {"ebnf": "\n".join(rules) + "\n"}


def arguments_rule(items: list[tuple[str, bool]]) -> tuple[str, bool]:
    """A Lark expression for keyword arguments in order, separated by ", ", the optional ones
    (required False) left out or not; and whether it may match nothing."""
    if not items:
        return "", True
    (first, first_required), rest = items[0], items[1:]
    tail = " ".join(f'(", " {rule})' + ("" if required else "?") for rule, required in rest)
    with_first = f"{first} {tail}".strip()
    if first_required:
        return with_first, False
    without, may_be_empty = arguments_rule(rest)
    return (f"({with_first} | {without})" if without else with_first), may_be_empty


def calls_in(text: str) -> list[ToolCall] | None:
    try:
        tree = ast.parse(text, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):  # not Python, a NUL byte, nesting too deep
        return None
    return all_parsed([call_of(node) for node in tree.elts]) if isinstance(tree, ast.List) and tree.elts else None


def call_of(node: ast.expr) -> ToolCall | None:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    try:
        arguments = {keyword.arg: ast.literal_eval(JsonConstants().visit(keyword.value)) for keyword in node.keywords}
    except ValueError:
        return None
    return None if None in arguments else ToolCall.of(node.func.id, arguments)


class JsonConstants(ast.NodeTransformer):
    """Turns the names true, false and null into the constants they mean in JSON."""

    def visit_Name(self, node: ast.Name) -> ast.expr:
        return ast.Constant(JSON_CONSTANTS[node.id]) if node.id in JSON_CONSTANTS else node
