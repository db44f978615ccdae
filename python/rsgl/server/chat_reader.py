"""A chat answer's text read into OpenAI's message fields: `reasoning_content` (with a reasoning
parser), `content`, and `tool_calls` (when tools were offered), whole or as stream deltas."""

from __future__ import annotations

from dataclasses import dataclass

from rsgl._typing import JsonObject
from rsgl.server.reasoning import ReasoningSplitter
from rsgl.tools import ToolCall, ToolCallFormat
from rsgl.tools.calls import new_call_id


@dataclass(frozen=True)
class ChatReader:
    call_format: ToolCallFormat | None  # None: calls are not looked for
    reasoning: ReasoningSplitter | None  # None: no reasoning is split off
    legacy_functions: bool = False  # the call answers as the deprecated `function_call` (one call)

    def fields(self, text: str, finished: bool) -> tuple[str | None, str, list[ToolCall]]:
        """(reasoning, content, calls) of the output so far; until `finished`, content that may be
        the start of calls (or of a tag) is held back and no calls are read."""
        reasoning, content = self.reasoning.split(text, finished) if self.reasoning else (None, text)
        if self.call_format is None:
            return reasoning, content, []
        if finished:
            return (reasoning, *self.call_format.parse(content))
        return reasoning, content[: self.call_format.content_end(content)], []

    def partial_calls(self, text: str) -> list[tuple[str, str]]:
        """(name, arguments so far) of each call an unfinished output is writing."""
        if self.call_format is None:
            return []
        _, content = self.reasoning.split(text, False) if self.reasoning else (None, text)
        start = self.call_format.calls_start(content)
        return [] if start is None else [(call.name, call.arguments) for call in self.call_format.partial_calls(content[start:])]

    def choice(self, index: int, text: str, logprobs: JsonObject | None, finish_reason: str | None) -> JsonObject:
        """A whole answer's choice."""
        reasoning, content, calls = self.fields(text, finished=True)
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
    the parsed calls complete them when the answer ends)."""

    def __init__(self, reader: ChatReader) -> None:
        self.reader = reader
        self.text = ""
        self.sent_reasoning = ""
        self.sent_content = ""
        self.sent_calls: list[tuple[str, str]] = []  # (id, arguments sent) of each call begun

    def chunk_choice(self, index: int, new_text: str, logprobs: JsonObject | None, finish_reason: str | None) -> JsonObject:
        self.text += new_text
        finished = finish_reason is not None
        reasoning, content, calls = self.reader.fields(self.text, finished)
        delta: JsonObject = {}
        if reasoning and len(reasoning) > len(self.sent_reasoning):
            delta["reasoning_content"] = reasoning[len(self.sent_reasoning) :]
            self.sent_reasoning = reasoning
        if len(content) > len(self.sent_content):
            delta["content"] = content[len(self.sent_content) :]
            self.sent_content = content
        progress = [(call.name, call.arguments) for call in calls] if finished else self.reader.partial_calls(self.text)
        if self.reader.legacy_functions:
            if progress and (first := self.call_delta(0, *progress[0])):
                delta["function_call"] = first["function"]
        elif call_deltas := [d for i, (name, arguments) in enumerate(progress) if (d := self.call_delta(i, name, arguments))]:
            delta["tool_calls"] = call_deltas
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": self.reader.finish_with(calls, finish_reason)}

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


@dataclass
class AnswerPart:
    """One part of a streamed answer: its reasoning, a run of text, or one call."""

    kind: str  # "reasoning", "text" or "call"
    index: int  # its place among the answer's parts
    text: str = ""  # the reasoning, the text or the call's arguments so far
    call_id: str = ""
    name: str = ""


def whole_answer_parts(reasoning: str | None, content: str, calls: list[ToolCall]) -> list[AnswerPart]:
    """A whole answer's parts, as a stream of it gives them: the reasoning, the text (trimmed when
    calls follow it), each call."""
    parts = [AnswerPart("reasoning", 0, reasoning)] if reasoning else []
    text = content.strip() if calls else content
    if text:
        parts.append(AnswerPart("text", len(parts), text))
    return parts + [AnswerPart("call", len(parts) + i, call.arguments, call.id, call.name) for i, call in enumerate(calls)]


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
        part.text += text
        return ("add", part, text)

    def end(self) -> list[tuple[str, AnswerPart, str]]:
        """Ends the open part, if any (call it once the answer has ended)."""
        if self.open is None:
            return []
        part, self.open = self.open, None
        return [("end", part, "")]
