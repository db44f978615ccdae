"""JSON being written, read as far as it goes: for tool-call arguments streamed while the model
writes them. Text is given in the form `ToolCall.arguments` has once the call is whole (orjson's:
no whitespace, each scalar as orjson writes it), so the streamed pieces join into exactly the
arguments of the parsed call."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import orjson

SCALAR = re.compile(r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?|true|false|null")
WHITESPACE = " \t\n\r"
SCALAR_ENDS = frozenset(",}]" + WHITESPACE)  # what shows a number or constant is whole
MAX_ESCAPE = 12  # the longest escape a string's tail may be cut inside: a surrogate pair, \uXXXX\uXXXX


@dataclass(frozen=True)
class PartialCall:
    """A call being written: its function's name (known before any argument is streamed) and the
    arguments so far, a prefix of the `ToolCall.arguments` it becomes."""

    name: str
    arguments: str


def canonical(value: object) -> str | None:
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError:  # an integer beyond 64 bits, a lone surrogate
        return None


def skip_whitespace(text: str, index: int) -> int:
    while index < len(text) and text[index] in WHITESPACE:
        index += 1
    return index


def string_end(text: str, start: int) -> int | None:
    """The index after the string opened at `start` (a quote), or None if it is not closed yet."""
    index = start + 1
    while (index := text.find('"', index)) >= 0:
        backslashes = 0  # counted back from the quote: an odd number escapes it
        while text[index - 1 - backslashes] == "\\":
            backslashes += 1
        if backslashes % 2 == 0:
            return index + 1
        index += 1
    return None


def open_string(body: str) -> str:
    """The canonical text of an unclosed string whose characters so far are `body` (without its
    opening quote): up to the last whole character, an escape cut in two left for later."""
    for cut in range(min(MAX_ESCAPE, len(body)) + 1):
        try:
            text = canonical(json.loads('"' + body[: len(body) - cut] + '"'))
        except ValueError:
            continue
        if text is not None:
            return text[:-1]  # without the closing quote
    return '"'


def value_prefix(text: str, start: int) -> tuple[str, int | None]:
    """(canonical text so far, the index after it if it is whole) of the JSON value that begins at
    `start` (after whitespace). A number or constant is held back until what follows shows it
    whole; text that is not JSON stops the reading where it begins."""
    out: list[str] = []
    depth = 0
    index = skip_whitespace(text, start)
    while index < len(text):
        char = text[index]
        if char in WHITESPACE:
            index += 1
            continue
        if char in ",:" and depth:
            out.append(char)
            index += 1
            continue
        if char in "{[":
            depth += 1
            out.append(char)
            index += 1
            continue
        if char in "}]" and depth:
            depth -= 1
            out.append(char)
            index += 1
        elif char == '"':
            end = string_end(text, index)
            if end is None:
                out.append(open_string(text[index + 1 :]))
                break
            piece = parse_canonical(text[index:end])
            if piece is None:
                break
            out.append(piece)
            index = end
        else:
            match = SCALAR.match(text, index)
            whole = match is not None and text[match.end() : match.end() + 1] in SCALAR_ENDS
            if match is None or not whole or (piece := parse_canonical(match.group())) is None:
                break
            out.append(piece)
            index = match.end()
        if not depth:
            return "".join(out), index
    return "".join(out), None


def object_prefix(text: str, start: int) -> str:
    """The canonical text so far of a JSON object that begins at `start` (after whitespace); empty
    if something else begins there (it is not streamed, the parsed call brings it whole)."""
    return value_prefix(text, start)[0] if text.startswith("{", skip_whitespace(text, start)) else ""


def parse_canonical(token: str) -> str | None:
    try:
        return canonical(json.loads(token))
    except ValueError:
        return None


def call_object(text: str, start: int, arguments_keys: tuple[str, ...]) -> tuple[PartialCall | None, int | None]:
    """The call being written as a JSON object `{"name": ..., ARGUMENTS_KEY: {...}}` from `start`:
    (the call once its name is known, the index after the object if it is whole). Arguments given
    as anything but an object (JSON text in a string, say) are not streamed: they come whole."""
    index = skip_whitespace(text, start)
    if not text.startswith("{", index):
        return None, None
    name, arguments = None, ""
    index += 1
    while True:
        index = skip_whitespace(text, index)
        if text.startswith("}", index):
            return (PartialCall(name, arguments) if name else None), index + 1
        if text.startswith(",", index):
            index = skip_whitespace(text, index + 1)
        key_end = string_end(text, index) if text.startswith('"', index) else None
        colon = skip_whitespace(text, key_end) if key_end is not None else None
        if colon is None or not text.startswith(":", colon):
            break
        try:
            key = json.loads(text[index:key_end])
        except ValueError:  # a key that is not a JSON string (a bad escape): not a call's object
            break
        value_start = skip_whitespace(text, colon + 1)
        value, end = value_prefix(text, value_start)
        if key == "name" and end is not None:
            name = json.loads(text[value_start:end]) if text.startswith('"', value_start) else None
        elif key in arguments_keys:
            arguments = value if text.startswith("{", value_start) else ""
        if end is None:
            break
        index = end
    return (PartialCall(name, arguments) if isinstance(name, str) else None), None


def call_objects(text: str, start: int, separator: str, arguments_keys: tuple[str, ...] = ("arguments",)) -> list[PartialCall]:
    """The calls being written as JSON objects from `start`, `separator` between them."""
    calls = []
    while True:
        call, end = call_object(text, start, arguments_keys)
        if call is not None:
            calls.append(call)
        start = skip_whitespace(text, end) if end is not None else len(text)
        if call is None or end is None or not text.startswith(separator, start):
            return calls
        start += len(separator)
