"""`--reasoning-parser`: a reasoning model's reasoning apart from its answer, for OpenAI's
`reasoning_content`: `<think>...</think>` (DeepSeek-R1, Qwen3), or harmony's analysis channel (gpt-oss)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from rsgl.tools.calls import ToolCall
from rsgl.tools.formats.base import partial_marker_length
from rsgl.tools.formats.harmony import CLUE as HARMONY_CLUE
from rsgl.tools.formats.harmony import HarmonyFormat, read_messages

THINK_START, THINK_END = "<think>", "</think>"
HARMONY = "gpt-oss"


class ReasoningSplitter(Protocol):
    @property
    def keeps_special_tokens(self) -> bool:
        """Whether the markers are special tokens, which decoding must keep."""

    def split(self, text: str, finished: bool) -> tuple[str, str]:
        """(reasoning, content) of the output so far. Until it is `finished`, text that may still
        turn out to be part of a marker is held back, so both only grow as the output does."""


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
