"""What every model family's tool-call format provides, and the marker logic they share."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod

import orjson

from rsgl import _core
from rsgl._typing import JsonObject
from rsgl.tools.calls import Function, ToolCall
from rsgl.tools.partial_json import PartialCall

# The layout the engine gives `json_schema` output (JSON_LAYOUT in rust/engine/src/grammar/llg.rs).
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class ToolCallFormat(ABC):
    """How one model family writes tool calls: the text that opens them (`markers`), anywhere in
    the output or only at its start (`markers_anywhere`), how to read them back, how to write them
    (for past turns and instructions) and the grammar that forces them."""

    name: str
    markers: tuple[str, ...]
    markers_anywhere: bool
    keeps_special_tokens = False  # the marker is a special token, which decoding must keep

    @abstractmethod
    def parse_calls(self, text: str) -> list[ToolCall] | None:
        """The calls in `text` (which starts with a marker), or None if it does not parse."""

    @abstractmethod
    def write(self, calls: list[ToolCall]) -> str:
        """`calls` as this model family writes them."""

    @abstractmethod
    def constraint(self, functions: list[Function], parallel: bool) -> JsonObject:
        """Grammar sampling params (`ebnf`: a Lark grammar) forcing one call of `functions` (one or
        more with `parallel`), its arguments matching the function's parameters schema."""

    def partial_calls(self, text: str) -> list[PartialCall]:
        """The calls being written in an unfinished output's `text` (from where calls begin), for
        streaming them: by default the calls already whole, as `parse_calls` reads an output cut short."""
        return [PartialCall(call.name, call.arguments) for call in self.parse_calls(text) or []]

    def for_template(self, template: str | None) -> ToolCallFormat:
        """This format as the model behind `template` writes it (a family may have several forms)."""
        return self

    def calls_start(self, text: str) -> int | None:
        """Where the calls begin in `text`, if they do."""
        if self.markers_anywhere:
            found = [index for marker in self.markers if (index := text.find(marker)) >= 0]
            return min(found, default=None)
        start = len(text) - len(text.lstrip())
        return start if text.startswith(self.markers, start) else None

    def content_end(self, text: str) -> int:
        """How much of a partial output is surely content: it stops where calls begin, or before a
        tail that could still become a marker."""
        start = self.calls_start(text)
        if start is not None:
            return start
        if not self.markers_anywhere:
            head = text.lstrip()
            return 0 if any(marker.startswith(head) for marker in self.markers) else len(text)
        return len(text) - partial_marker_length(text, self.markers)

    def finder(self) -> CallsFinder:
        return CallsFinder(self)

    def parse(self, text: str) -> tuple[str, list[ToolCall]]:
        """(content, calls) of a whole output; output whose calls do not parse is all content."""
        start = self.calls_start(text)
        calls = None if start is None else self.parse_calls(text[start:])
        if start is None or not calls:
            return text, []
        return text[:start], calls


class CallsFinder:
    """`ToolCallFormat.content_end` over a content streamed in pieces, each piece looked at once:
    what is surely content passes as it comes, a tail that may still begin a marker is held back,
    and once the calls begin everything from there on is theirs (`calls`)."""

    def __init__(self, call_format: ToolCallFormat) -> None:
        self.format = call_format
        self.held = ""  # content that may begin a marker (or, for markers only at the start, the content until it is known)
        self.calls: str | None = None  # the text from where calls begin
        self.passing = False  # markers only at the start, and the content did not start with one

    def feed(self, new_content: str) -> str:
        """The part of the content so far, with `new_content`, that is surely content and was not given before."""
        if self.calls is not None:
            self.calls += new_content
            return ""
        if self.passing:
            return new_content
        text = self.held + new_content
        start = self.format.calls_start(text)
        if start is not None:
            self.calls, self.held = text[start:], ""
            return text[:start]
        end = self.format.content_end(text)
        self.passing = not self.format.markers_anywhere and end > 0
        self.held = text[end:]
        return text[:end]


def partial_marker_length(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest end of `text` that begins some marker (without being all of it)."""
    longest = min(len(text), max(map(len, markers)) - 1)
    return next((k for k in range(longest, 0, -1) if any(marker.startswith(text[-k:]) for marker in markers)), 0)


def lark_literal(text: str) -> str:
    return orjson.dumps(text).decode()


def lark_json(schema: JsonObject) -> str:
    """A JSON schema inlined in a Lark grammar as the engine takes `json_schema`: through the schema
    policy, which `%json` would bypass (its relaxations are reported where the tools are read), and
    laid out as `json_schema` output is (no free whitespace, so a model cannot pad forever)."""
    relaxed, _ = _core.relax_json_schema(orjson.dumps(schema).decode())
    return "%json " + orjson.dumps({**orjson.loads(relaxed), "x-guidance": JSON_LAYOUT}).decode()


def json_sequence(text: str, separator: str) -> tuple[list[object], str]:
    """The JSON values at the start of `text`, `separator` (and whitespace) between them, and the
    text after the last one: empty if they were all of it; starting with `separator` if what follows
    it does not parse (as when the output was cut short in the middle of a value)."""
    decoder = json.JSONDecoder()
    values: list[object] = []
    rest = candidate = text.lstrip()
    while True:
        try:
            value, end = decoder.raw_decode(candidate)
        except ValueError:
            return values, rest
        values.append(value)
        rest = candidate[end:].lstrip()
        if not separator or not rest.startswith(separator):
            return values, rest
        candidate = rest[len(separator) :].lstrip()
