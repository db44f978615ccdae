"""A chat answer's text read into OpenAI's message fields: `reasoning_content` (with a reasoning
parser), `content`, and `tool_calls` (when tools were offered), whole or as stream deltas."""

from __future__ import annotations

from dataclasses import dataclass

from rsgl._typing import JsonObject
from rsgl.server.reasoning import ReasoningSplitter
from rsgl.tools import ToolCall, ToolCallFormat


@dataclass(frozen=True)
class ChatReader:
    call_format: ToolCallFormat | None  # None: calls are not looked for
    reasoning: ReasoningSplitter | None  # None: no reasoning is split off

    def fields(self, text: str, finished: bool) -> tuple[str | None, str, list[ToolCall]]:
        """(reasoning, content, calls) of the output so far; until `finished`, content that may be
        the start of calls (or of a tag) is held back and no calls are read."""
        reasoning, content = self.reasoning.split(text, finished) if self.reasoning else (None, text)
        if self.call_format is None:
            return reasoning, content, []
        if finished:
            return (reasoning, *self.call_format.parse(content))
        return reasoning, content[: self.call_format.content_end(content)], []

    def choice(self, index: int, text: str, logprobs: JsonObject | None, finish_reason: str | None) -> JsonObject:
        """A whole answer's choice."""
        reasoning, content, calls = self.fields(text, finished=True)
        message: JsonObject = {"role": "assistant", "content": (content.strip() or None) if calls else content}
        if self.reasoning:
            message["reasoning_content"] = reasoning or None
        if calls:
            message["tool_calls"] = [call.as_openai() for call in calls]
        return {"index": index, "message": message, "logprobs": logprobs, "finish_reason": finish_with(calls, finish_reason)}

    def deltas(self) -> ChatDeltas:
        return ChatDeltas(self)


def finish_with(calls: list[ToolCall], finish_reason: str | None) -> str | None:
    """OpenAI's "tool_calls" for an answer that called tools, unless max_tokens cut it short (the
    calls that were complete then stand, and the finish reason stays "length")."""
    return "tool_calls" if calls and finish_reason != "length" else finish_reason


class ChatDeltas:
    """One streamed answer's deltas: what each chunk adds to the reasoning, the content and the
    calls (sent whole, once the answer ends and they parse)."""

    def __init__(self, reader: ChatReader) -> None:
        self.reader = reader
        self.text = ""
        self.sent_reasoning = ""
        self.sent_content = ""

    def chunk_choice(self, index: int, new_text: str, logprobs: JsonObject | None, finish_reason: str | None) -> JsonObject:
        self.text += new_text
        reasoning, content, calls = self.reader.fields(self.text, finished=finish_reason is not None)
        delta: JsonObject = {}
        if reasoning and len(reasoning) > len(self.sent_reasoning):
            delta["reasoning_content"] = reasoning[len(self.sent_reasoning) :]
            self.sent_reasoning = reasoning
        if len(content) > len(self.sent_content):
            delta["content"] = content[len(self.sent_content) :]
            self.sent_content = content
        if calls:
            delta["tool_calls"] = [{"index": i, **call.as_openai()} for i, call in enumerate(calls)]
            finish_reason = finish_with(calls, finish_reason)
        return {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
