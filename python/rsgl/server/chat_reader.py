"""A chat answer's text read into OpenAI's message fields: `reasoning_content` (with a reasoning
parser), `content`, and `tool_calls` (when tools were offered), whole or as stream deltas."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from rsgl._typing import JsonObject
from rsgl.server.reasoning import ReasoningSplitter, ReasoningStream
from rsgl.tools import ToolCall, ToolCallFormat
from rsgl.tools.calls import new_call_id


@dataclass(frozen=True)
class ChatReader:
    call_format: ToolCallFormat | None  # None: calls are not looked for
    reasoning: ReasoningSplitter | None  # None: no reasoning is split off
    legacy_functions: bool = False  # the call answers as the deprecated `function_call` (one call)

    def fields(self, text: str) -> tuple[str | None, str, list[ToolCall]]:
        """(reasoning, content, calls) of a whole answer."""
        reasoning, content = self.reasoning.split(text, True) if self.reasoning else (None, text)
        return (reasoning, *self.calls_in(content))

    def calls_in(self, content: str) -> tuple[str, list[ToolCall]]:
        """(content, calls) of a whole answer's content, the calls read off when tools were offered."""
        return self.call_format.parse(content) if self.call_format else (content, [])

    def choice(self, index: int, text: str, logprobs: JsonObject | None, finish_reason: str | None) -> JsonObject:
        """A whole answer's choice."""
        reasoning, content, calls = self.fields(text)
        message: JsonObject = {"role": "assistant", "content": (content.strip() or None) if calls else content}
        if self.reasoning:
            message["reasoning_content"] = reasoning or None
        if calls and self.legacy_functions:
            message["function_call"] = {"name": calls[0].name, "arguments": calls[0].arguments}
        elif calls:
            message["tool_calls"] = [call.as_openai() for call in calls]
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": self.finish_with(calls, finish_reason)}

    def deltas(self) -> ChatDeltas:
        return ChatDeltas(self)

    def finish_with(self, calls: list[ToolCall], finish_reason: str | None) -> str | None:
        """OpenAI's "tool_calls" (or "function_call") for an answer that called tools, unless
        max_tokens cut it short (the calls that were complete then stand, and it stays "length")."""
        if not calls or finish_reason == "length":
            return finish_reason
        return "function_call" if self.legacy_functions else "tool_calls"


class ChatDeltas:
    """One streamed answer's deltas: what each chunk adds to the reasoning, the content and the
    calls (each call's id and name once its name is known, then its arguments as they are written;
    the parsed calls complete them when the answer ends). Each chunk's text is read once (calls
    being written are read again from where they begin); the answer is read whole when it ends."""

    def __init__(self, reader: ChatReader) -> None:
        self.reader = reader
        self.split: ReasoningStream = reader.reasoning.stream() if reader.reasoning else WholeContent()
        self.finder = reader.call_format.finder() if reader.call_format else None
        self.sent_reasoning = 0  # characters
        self.sent_content = 0
        self.sent_calls: list[tuple[str, str]] = []  # (id, arguments sent) of each call begun

    def chunk_choice(self, index: int, new_text: str, logprobs: JsonObject | None, finish_reason: str | None) -> JsonObject:
        if finish_reason is None:
            reasoning, content, unsettled = self.split.feed(new_text)
            content = self.finder.feed(content) if self.finder else content
            calls: list[ToolCall] = []
        else:
            (reasoning, content, calls), unsettled = self.whole_fields(new_text), ""
        delta: JsonObject = {}
        if reasoning:
            delta["reasoning_content"] = reasoning
            self.sent_reasoning += len(reasoning)
        if content:
            delta["content"] = content
            self.sent_content += len(content)
        if finish_reason is not None:
            progress = [(call.name, call.arguments) for call in calls]
        elif self.finder is not None and self.finder.calls is not None:
            assert self.reader.call_format is not None
            progress = [(call.name, call.arguments) for call in self.reader.call_format.partial_calls(self.finder.calls + unsettled)]
        else:
            progress = []
        if self.reader.legacy_functions:
            if progress and (first := self.call_delta(0, *progress[0])):
                delta["function_call"] = first["function"]
        elif call_deltas := [d for i, (name, arguments) in enumerate(progress) if (d := self.call_delta(i, name, arguments))]:
            delta["tool_calls"] = call_deltas
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": self.reader.finish_with(calls, finish_reason)}

    def whole_fields(self, last_text: str) -> tuple[str, str, list[ToolCall]]:
        """What the finished answer, `last_text` its last piece, adds to the reasoning and content
        sent (read whole, as `ChatReader.fields` reads it), and its calls."""
        reasoning, content = self.split.finish(last_text)
        content, calls = self.reader.calls_in(content)
        return reasoning[self.sent_reasoning :], content[self.sent_content :], calls

    def call_delta(self, index: int, name: str, arguments: str) -> JsonObject | None:
        """What call `index` adds: all of it the first time, then the arguments' new text (which,
        once whole, may only differ from what was sent by what follows it)."""
        if index == len(self.sent_calls):
            call_id = new_call_id()
            self.sent_calls.append((call_id, arguments))
            return {"index": index, "id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        call_id, sent = self.sent_calls[index]
        if len(arguments) <= len(sent) or not arguments.startswith(sent):
            return None
        self.sent_calls[index] = (call_id, arguments)
        return {"index": index, "function": {"arguments": arguments[len(sent) :]}}


class WholeContent:
    """The stream of an answer without reasoning: all of it is content."""

    def __init__(self) -> None:
        self.pieces: list[str] = []

    def feed(self, new_text: str) -> tuple[str, str, str]:
        self.pieces.append(new_text)
        return "", new_text, ""

    def finish(self, new_text: str) -> tuple[str, str]:
        self.pieces.append(new_text)
        return "", "".join(self.pieces)


@dataclass
class AnswerPart:
    """One part of a streamed answer: its reasoning, a run of text, or one call."""

    kind: str  # "reasoning", "text" or "call"
    index: int  # its place among the answer's parts
    pieces: list[str] = dataclasses.field(default_factory=list)  # of `text`, joined when it is read
    call_id: str = ""
    name: str = ""

    @property
    def text(self) -> str:
        """The reasoning, the text or the call's arguments so far."""
        if len(self.pieces) > 1:
            self.pieces[:] = ["".join(self.pieces)]
        return self.pieces[0] if self.pieces else ""


def whole_answer_parts(reasoning: str | None, content: str, calls: list[ToolCall]) -> list[AnswerPart]:
    """A whole answer's parts, as a stream of it gives them: the reasoning, the text (trimmed when
    calls follow it), each call."""
    parts = [AnswerPart("reasoning", 0, [reasoning])] if reasoning else []
    text = content.strip() if calls else content
    if text:
        parts.append(AnswerPart("text", len(parts), [text]))
    return parts + [AnswerPart("call", len(parts) + i, [call.arguments], call.id, call.name) for i, call in enumerate(calls)]


class AnswerParts:
    """A streamed answer's chat deltas as parts in order, for the APIs that send an answer as a
    sequence of blocks or items (Anthropic's Messages, OpenAI's Responses): a part begins when the
    kind of text changes or a call begins, and ends when the next begins or the answer ends. `feed`
    and `end` give ("begin" | "add" | "end", part, new text) events."""

    def __init__(self) -> None:
        self.parts: list[AnswerPart] = []
        self.open: AnswerPart | None = None
        self.calls: dict[int, AnswerPart] = {}  # a call's index among the calls -> its part

    def feed(self, delta: JsonObject) -> list[tuple[str, AnswerPart, str]]:
        events = []
        for kind, field in (("reasoning", "reasoning_content"), ("text", "content")):
            if delta.get(field):
                if self.open is None or self.open.kind != kind:
                    events += self.begin(AnswerPart(kind, len(self.parts)))
                events.append(self.add(self.open, delta[field]))
        for call in delta.get("tool_calls", []):
            if "id" in call:
                events += self.begin(AnswerPart("call", len(self.parts), call_id=call["id"], name=call["function"]["name"]))
                self.calls[call["index"]] = self.parts[-1]
            if call["function"]["arguments"]:
                events.append(self.add(self.calls[call["index"]], call["function"]["arguments"]))
        return events

    def begin(self, part: AnswerPart) -> list[tuple[str, AnswerPart, str]]:
        events = self.end()
        self.parts.append(part)
        self.open = part
        return [*events, ("begin", part, "")]

    def add(self, part: AnswerPart | None, text: str) -> tuple[str, AnswerPart, str]:
        assert part is not None
        part.pieces.append(text)
        return ("add", part, text)

    def end(self) -> list[tuple[str, AnswerPart, str]]:
        """Ends the open part, if any (call it once the answer has ended)."""
        if self.open is None:
            return []
        part, self.open = self.open, None
        return [("end", part, "")]
