"""`--reasoning-parser`: a thinking model's `<think>...</think>` apart from its answer, for
OpenAI's `reasoning_content`."""

from __future__ import annotations

from dataclasses import dataclass

from rsgl.tools.formats.base import partial_marker_length

THINK_START, THINK_END = "<think>", "</think>"
# SGLang's parser names, and whether the model's output starts inside its reasoning even without a
# `<think>` of its own (DeepSeek-R1's template opens it in the prompt).
REASONING_PARSERS = {"deepseek-r1": True, "qwen3": False}


@dataclass(frozen=True)
class ReasoningSplitter:
    starts_inside: bool

    @classmethod
    def for_prompt(cls, parser: str, prompt: str) -> ReasoningSplitter:
        """The splitter for one request: its output starts inside the reasoning if the parser says
        so or the prompt itself opened a `<think>` (as Qwen3's template does with thinking forced),
        unless the prompt closed it already (as templates do with thinking turned off)."""
        tail = prompt.rstrip()
        return cls((REASONING_PARSERS[parser] or tail.endswith(THINK_START)) and not tail.endswith(THINK_END))

    def split(self, text: str, finished: bool) -> tuple[str, str]:
        """(reasoning, content) of the output so far. Until it is `finished`, text that may still
        turn out to be part of a tag is held back, so both only grow as the output does."""
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
