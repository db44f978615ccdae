"""OpenAI's harmony format, which gpt-oss speaks (SGLang's and vLLM's `gpt-oss` parsers). The
answer is a sequence of messages, each in a channel: `analysis` (the reasoning), `commentary`
(calls, and preambles to them) and `final` (the answer):

    <|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>...<|return|>

A call is a message to `functions.NAME`, its recipient written in the header (after the channel or
after the role), its arguments JSON:

    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"city": "Paris"}<|call|>

`<|return|>` and `<|call|>` end generation (they are the checkpoints' end-of-sequence tokens). The
markers are special tokens, which decoding must keep. Messages are read here; which channel goes
where is `rsgl.server.reasoning.HarmonySplitter`'s, which passes calls on as `write` writes them."""

from __future__ import annotations

import re
from dataclasses import dataclass

from rsgl._typing import JsonObject
from rsgl.tools.calls import Function, ToolCall, closed
from rsgl.tools.formats.base import ToolCallFormat, lark_json, lark_literal, partial_marker_length
from rsgl.tools.partial_json import PartialCall, object_prefix

START, CHANNEL, CONSTRAIN, MESSAGE = "<|start|>", "<|channel|>", "<|constrain|>", "<|message|>"
END, CALL, RETURN = "<|end|>", "<|call|>", "<|return|>"
MESSAGE_ENDS = (END, CALL, RETURN)
FUNCTIONS = "functions."  # the namespace of the request's tools; other recipients are built-in tools
RECIPIENT = re.compile(r"\bto=([^\s<]+)")
MARKER = re.compile("|".join(map(re.escape, (START, CHANNEL, CONSTRAIN, MESSAGE, END, CALL, RETURN))))
CLUE = CHANNEL  # what gives a harmony chat template away


@dataclass(frozen=True)
class HarmonyMessage:
    channel: str | None  # None: text outside any message (output that is not harmony)
    recipient: str | None
    body: str

    @property
    def function(self) -> str | None:
        """The function this message calls, if it is a call."""
        return self.recipient.removeprefix(FUNCTIONS) if self.recipient and self.recipient.startswith(FUNCTIONS) else None


def read_messages(text: str, finished: bool) -> list[HarmonyMessage]:
    """The messages of an assistant's output (which starts in its first header, the prompt having
    opened it with `<|start|>assistant`). Until the output is `finished`, a message whose header is
    still being written is left out and a body's tail that may become a marker is held back; once
    finished, text that is not in a message is kept, without markers, as a message of no channel."""
    messages = []
    segments = text.split(START)
    for i, segment in enumerate(segments):
        header, opened, rest = segment.partition(MESSAGE)
        if not opened:
            if finished and segment.strip():
                messages.append(HarmonyMessage(None, None, MARKER.sub("", segment)))
            continue
        ends = [index for end in MESSAGE_ENDS if (index := rest.find(end)) >= 0]
        if ends:
            body = rest[: min(ends)]
        else:
            last = i == len(segments) - 1
            body = rest[: len(rest) - partial_marker_length(rest, (*MESSAGE_ENDS, START))] if last and not finished else rest
        messages.append(message_of(header, body))
    return messages


def message_of(header: str, body: str) -> HarmonyMessage:
    """The message whose header (after `<|start|>`, before `<|message|>`) and body are these."""
    _, _, channel = header.partition(CHANNEL)
    recipient = RECIPIENT.search(header)
    return HarmonyMessage(channel.split(maxsplit=1)[0] if channel.strip() else "", recipient and recipient.group(1), body)


def call_head(function: str) -> str:
    """How `HarmonyFormat.write` begins a call of `function`, up to its arguments (then `<|call|>`)."""
    return f"{START}assistant to={FUNCTIONS}{function}{CHANNEL}commentary json{MESSAGE}"


class HarmonyFormat(ToolCallFormat):
    """Calls as `HarmonySplitter` passes them on: each a message from `<|start|>` on, as `write`
    writes them (the form the chat template renders past calls in)."""

    name = "gpt-oss"
    markers = (START,)
    markers_anywhere = True
    keeps_special_tokens = True

    def parse_calls(self, text: str) -> list[ToolCall] | None:
        calls = [ToolCall.of(message.function, message.body) for message in read_messages(text, finished=True) if message.function]
        # A call cut short (by max_tokens) does not parse: the calls before it stand.
        parsed = [call for call in calls if call is not None]
        return parsed or None

    def partial_calls(self, text: str) -> list[PartialCall]:
        return [PartialCall(message.function, object_prefix(message.body, 0)) for message in read_messages(text, finished=False) if message.function]

    def write(self, calls: list[ToolCall]) -> str:
        return "".join(f"{call_head(call.name)}{call.arguments}{CALL}" for call in calls)

    def constraint(self, functions: list[Function], parallel: bool) -> JsonObject:
        """The model may reason first (an analysis message), then calls one function (a harmony turn
        ends at its call, so `parallel` allows no more); markers are the tokenizer's special tokens."""
        rules = [
            "start: analysis? call",
            'analysis: <|channel|> "analysis" <|message|> REASONING <|end|> <|start|> "assistant"',
            "REASONING: /(.|\\n)*/",
            f"call: {' | '.join(f'call{i}' for i in range(len(functions)))}",
        ]
        for i, function in enumerate(functions):
            recipient = lark_literal(f"commentary to={FUNCTIONS}{function.name} ")
            rules += [
                f'call{i}: <|channel|> {recipient} <|constrain|> "json" <|message|> args{i} <|call|>',
                f"args{i}: {lark_json(closed(function.parameters))}",
            ]
        return {"ebnf": "\n".join(rules) + "\n"}
