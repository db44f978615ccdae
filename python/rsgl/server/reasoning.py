"""`--reasoning-parser`: a reasoning model's reasoning apart from its answer, for OpenAI's
`reasoning_content`: `<think>...</think>` (DeepSeek-R1, Qwen3), or harmony's analysis channel (gpt-oss)."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rsgl.tools.calls import ToolCall
from rsgl.tools.formats.base import partial_marker_length
from rsgl.tools.formats.harmony import CALL, MESSAGE, MESSAGE_ENDS, START, HarmonyFormat, call_head, message_of, read_messages
from rsgl.tools.formats.harmony import CLUE as HARMONY_CLUE

THINK_START, THINK_END = "<think>", "</think>"
HARMONY = "gpt-oss"


class ReasoningStream(Protocol):
    """One streamed output read by a splitter chunk by chunk, each chunk's text looked at once
    (with the few characters that may begin a marker held back until the next)."""

    def feed(self, new_text: str) -> tuple[str, str, str]:
        """What `new_text` adds to the unfinished output's reasoning and content (as `split` reads
        them, so both only grow), and the text that follows the content for now only: the end
        marker of a call still being written."""

    def finish(self, new_text: str) -> tuple[str, str]:
        """(reasoning, content) of the whole output, `new_text` its last piece."""


class ReasoningSplitter(Protocol):
    @property
    def keeps_special_tokens(self) -> bool:
        """Whether the markers are special tokens, which decoding must keep."""

    def split(self, text: str, finished: bool) -> tuple[str, str]:
        """(reasoning, content) of the output so far. Until it is `finished`, text that may still
        turn out to be part of a marker is held back, so both only grow as the output does."""

    def stream(self) -> ReasoningStream:
        """`split` for a streamed output, chunk by chunk."""


@dataclass(frozen=True)
class ThinkSplitter:
    starts_inside: bool  # the output is reasoning even before a `<think>` of its own
    keeps_special_tokens = False

    @classmethod
    def for_prompt(cls, starts_inside: bool, prompt: str) -> ThinkSplitter:
        """The splitter for one request: its output starts inside the reasoning if the parser says
        so or the prompt itself opened a `<think>` (as Qwen3's template does with thinking forced),
        unless the prompt closed it already (as templates do with thinking turned off)."""
        tail = prompt.rstrip()
        return cls((starts_inside or tail.endswith(THINK_START)) and not tail.endswith(THINK_END))

    def split(self, text: str, finished: bool) -> tuple[str, str]:
        head = text.lstrip()
        if not finished and THINK_START.startswith(head):
            return "", ""  # nothing yet, or a start tag being written
        opened = head.startswith(THINK_START)
        if not (opened or self.starts_inside):
            return "", text
        body = head.removeprefix(THINK_START)
        end = body.find(THINK_END)
        if end >= 0:
            return body[:end].lstrip(), body[end + len(THINK_END) :].lstrip()
        held = 0 if finished else partial_marker_length(body, (THINK_END,))
        return body[: len(body) - held].lstrip(), ""

    def stream(self) -> ThinkStream:
        return ThinkStream(self)


class WithoutLeadingSpace:
    """A text streamed in pieces, its leading whitespace dropped."""

    def __init__(self) -> None:
        self.begun = False

    def __call__(self, piece: str) -> str:
        if not self.begun:
            piece = piece.lstrip()
            self.begun = bool(piece)
        return piece


class ThinkStream:
    """`ThinkSplitter.split` chunk by chunk: undecided while the output may still open with
    `<think>`, then the reasoning (until `</think>`, a tail that may begin it held back) or the
    content."""

    def __init__(self, splitter: ThinkSplitter) -> None:
        self.splitter = splitter
        self.pieces: list[str] = []  # the whole output, for `finish`
        self.head: str | None = ""  # the output without its leading whitespace, until it is decided
        self.inside = False  # in the reasoning
        self.held = ""  # the reasoning's tail that may begin `</think>`
        self.reasoning = WithoutLeadingSpace()
        self.content_after = WithoutLeadingSpace()  # the content after `</think>`
        self.after = False

    def feed(self, new_text: str) -> tuple[str, str, str]:
        self.pieces.append(new_text)
        if self.head is not None:
            self.head = self.head + new_text if self.head else new_text.lstrip()
            if THINK_START.startswith(self.head):
                return "", "", ""  # nothing yet, or a start tag being written
            if not (self.head.startswith(THINK_START) or self.splitter.starts_inside):
                self.head = None
                return "", "".join(self.pieces), ""
            new_text, self.head, self.inside = self.head.removeprefix(THINK_START), None, True
        if not self.inside:
            return "", self.content_after(new_text) if self.after else new_text, ""
        body = self.held + new_text
        end = body.find(THINK_END)
        if end >= 0:
            self.inside, self.after, self.held = False, True, ""
            return self.reasoning(body[:end]), self.content_after(body[end + len(THINK_END) :]), ""
        keep = partial_marker_length(body, (THINK_END,))
        self.held = body[len(body) - keep :]
        return self.reasoning(body[: len(body) - keep]), "", ""

    def finish(self, new_text: str) -> tuple[str, str]:
        self.pieces.append(new_text)
        return self.splitter.split("".join(self.pieces), True)


class HarmonySplitter:
    """Harmony's analysis messages are the reasoning; the content is the other messages' text
    (final answers and preambles), with calls passed on in harmony form for `HarmonyFormat`."""

    keeps_special_tokens = True

    def split(self, text: str, finished: bool) -> tuple[str, str]:
        reasoning, content = [], []
        for message in read_messages(text, finished):
            if message.function:
                content.append(HarmonyFormat().write([ToolCall(message.function, message.body)]))
            elif message.channel == "analysis":
                reasoning.append(message.body)
            else:
                content.append(message.body)
        return "\n\n".join(reasoning), "".join(content)

    def stream(self) -> HarmonyStream:
        return HarmonyStream()


HEADER_END = re.compile("|".join(map(re.escape, (START, MESSAGE))))
BODY_END = re.compile("|".join(map(re.escape, (*MESSAGE_ENDS, START))))


class HarmonyStream:
    """`HarmonySplitter.split` chunk by chunk: each message read as its text comes, a call written
    out as `HarmonyFormat` writes it (its end marker once the call has ended)."""

    def __init__(self) -> None:
        self.pieces: list[str] = []  # the whole output, for `finish`
        self.header: str | None = ""  # the open segment's header while it is written
        self.kind: str | None = None  # the open message's body goes to "reasoning", "content" or "call"
        self.held = ""  # text after a header that may begin a marker
        self.analyses = 0  # analysis messages begun (the reasoning joins them with blank lines)

    def feed(self, new_text: str) -> tuple[str, str, str]:
        self.pieces.append(new_text)
        reasoning: list[str] = []
        content: list[str] = []
        text = new_text
        while True:
            if self.header is not None:
                header = self.header + text
                found = HEADER_END.search(header, max(0, len(self.header) - len(MESSAGE) + 1))
                if found is None:
                    self.header = header
                    break
                self.header, text = None, header[found.end() :]
                if found.group() == START:
                    self.header = ""  # a segment with no message, left out
                    continue
                message = message_of(header[: found.start()], "")
                if message.function:
                    self.kind = "call"
                    content.append(call_head(message.function))
                elif message.channel == "analysis":
                    self.kind = "reasoning"
                    reasoning.append("\n\n" if self.analyses else "")
                    self.analyses += 1
                else:
                    self.kind = "content"
                continue
            text, self.held = self.held + text, ""
            if self.kind is None:  # after a message's end, until the next one begins
                start = text.find(START)
                if start < 0:
                    self.held = text[len(text) - partial_marker_length(text, (START,)) :]
                    break
                self.header, text = "", text[start + len(START) :]
                continue
            found = BODY_END.search(text)
            end = len(text) - partial_marker_length(text, (*MESSAGE_ENDS, START)) if found is None else found.start()
            (reasoning if self.kind == "reasoning" else content).append(text[:end])
            if found is None:
                self.held = text[end:]
                break
            if self.kind == "call":
                content.append(CALL)
            self.kind, text = None, text[found.end() :]
            if found.group() == START:
                self.header = ""
        return "".join(reasoning), "".join(content), CALL if self.kind == "call" else ""

    def finish(self, new_text: str) -> tuple[str, str]:
        self.pieces.append(new_text)
        return HarmonySplitter().split("".join(self.pieces), True)


# SGLang's parser names, each with the splitter for a request's prompt.
REASONING_PARSERS: dict[str, Callable[[str], ReasoningSplitter]] = {
    "deepseek-r1": lambda prompt: ThinkSplitter.for_prompt(True, prompt),  # its template opens the <think> in the prompt
    "qwen3": lambda prompt: ThinkSplitter.for_prompt(False, prompt),
    HARMONY: lambda prompt: HarmonySplitter(),
}
# The parsers after whose `</think>` grammars apply (--think-end-token); harmony's forced calls
# allow the reasoning in their own grammar.
THINK_TAG_PARSERS = ("deepseek-r1", "qwen3")


def reasoning_parser_for_template(template: str | None) -> str | None:
    """The parser a chat template's model needs without being told: harmony's (gpt-oss always
    reasons, in its own channel); `<think>` models keep their reasoning in the content unless asked."""
    return HARMONY if template and HARMONY_CLUE in template else None
