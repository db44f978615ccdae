"""Streams cost the same per chunk however long the answer has grown: the engine's deltas stay
deltas through the OpenAI, Anthropic and Responses streams, and the reasoning and tool-call
parsers read each chunk's text once. Measured without a clock: the characters of text the
server's code holds while it handles one chunk (every str argument and local of its functions),
at chunk 100 and at chunk 4,000 of a synthetic answer. And, served: a long streamed answer's
deltas join into exactly the answer given whole."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from types import FrameType
from typing import Any

import pytest
from rsgl.server.anthropic_api import message_events
from rsgl.server.chat_reader import ChatReader
from rsgl.server.openai_api import chat_shape, stream_chunks
from rsgl.server.reasoning import HarmonySplitter, ThinkSplitter
from rsgl.server.responses_api import Keep, response_events
from rsgl.tools import FORMATS
from server_helpers import openai_client, running_server
from test_tool_calls import TOOLS, save_tiny_tools_model

CHUNKS = 4000
EARLY, LATE = range(100, 200), range(CHUNKS - 100, CHUNKS)
# Words of the answer, cycled: some end in what may begin a marker, which the parsers hold back.
WORDS = ["Paris ", "is ", "sunny <tool", "s> today", "; <|en", "d ", "a<b\n"]
# (reader, the answer's opening, where its reasoning ends and its content begins)
READERS = {
    "think+hermes": (ChatReader(FORMATS["hermes"], ThinkSplitter(starts_inside=False)), "<think>", "</think>\n\n"),
    "harmony+gpt-oss": (
        ChatReader(FORMATS["gpt-oss"], HarmonySplitter()),
        "<|channel|>analysis<|message|>",
        "<|end|><|start|>assistant<|channel|>final<|message|>",
    ),
}


class TextHeld:
    """A trace function counting the characters of the str arguments (when a function of rsgl
    is called or resumed) and str locals (when it returns or yields) of rsgl's code."""

    def __init__(self) -> None:
        self.characters = 0

    def __call__(self, frame: FrameType, event: str, arg: Any) -> Callable[..., Any] | None:
        if not frame.f_globals.get("__name__", "").startswith("rsgl."):
            return None
        frame.f_trace_lines = False
        if event in ("call", "return"):
            self.characters += sum(len(value) for value in frame.f_locals.values() if isinstance(value, str))
        return self


def synthetic_pieces(opening: str, turn: str) -> list[str]:
    """CHUNKS engine deltas' text: reasoning for 50 chunks, then the content."""
    pieces = [opening] + [WORDS[i % len(WORDS)] for i in range(1, CHUNKS)]
    pieces[50] = turn
    return pieces


async def engine_deltas(pieces: list[str], marks: list[int], held: TextHeld) -> AsyncIterator[dict[str, Any]]:
    """The engine's delta chunks of `pieces`, the last one finished; marks the count of characters
    held as each is asked for (so chunk i's share is marks[i + 1] - marks[i])."""
    for i, piece in enumerate([*pieces, ""]):
        marks.append(held.characters)
        finish = {"type": "length"} if i == len(pieces) else None
        meta = {"id": "r", "prompt_tokens": 5, "completion_tokens": i + 1, "cached_tokens": 0, "finish_reason": finish, "e2e_latency": 0.0}
        yield {"text": piece, "output_ids": [i], "meta_info": meta}
    marks.append(held.characters)


def run_pipeline(api: str, reader: ChatReader, stream: AsyncIterator[dict[str, Any]]) -> list[dict[str, Any]]:
    async def collect() -> list[dict[str, Any]]:
        if api == "openai":
            events = stream_chunks(None, stream, chat_shape(reader), {"id": "c"}, False, False)  # type: ignore[arg-type]
        elif api == "anthropic":
            events = message_events(stream, reader, {"id": "m"}, [])  # type: ignore[arg-type]
        else:
            events = response_events(stream, reader.deltas(), {"id": "resp_1"}, Keep(None, []))  # type: ignore[arg-type]
        return [event async for event in events]

    return asyncio.run(collect())


def streamed_fields(api: str, events: list[dict[str, Any]]) -> tuple[str, str]:
    """(reasoning, content) joined from a stream's events."""
    if api == "openai":
        deltas = [event["choices"][0]["delta"] for event in events if event["choices"]]
        return "".join(d.get("reasoning_content", "") for d in deltas), "".join(d.get("content", "") for d in deltas)
    if api == "anthropic":
        deltas = [event["delta"] for event in events if event["type"] == "content_block_delta"]
        return "".join(d.get("thinking", "") for d in deltas), "".join(d.get("text", "") for d in deltas)
    reasoning = "".join(event["delta"] for event in events if event["type"] == "response.reasoning_text.delta")
    return reasoning, "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")


@pytest.mark.parametrize("api", ["openai", "anthropic", "responses"])
@pytest.mark.parametrize("parsers", list(READERS))
def test_a_chunk_costs_the_same_at_4000_as_at_100(api: str, parsers: str):
    reader, opening, turn = READERS[parsers]
    pieces = synthetic_pieces(opening, turn)
    held, marks = TextHeld(), []
    sys.settrace(held)
    try:
        events = run_pipeline(api, reader, engine_deltas(pieces, marks, held))
    finally:
        sys.settrace(None)
    per_chunk = [after - before for before, after in zip(marks, marks[1:])]
    early, late = max(per_chunk[i] for i in EARLY), max(per_chunk[i] for i in LATE)
    assert 0 < late <= early, f"characters held per chunk: {early} at chunks 100-199, {late} at chunks 3,900-3,999"
    # And the stream says what the whole answer says.
    reasoning, content, _ = reader.fields("".join(pieces))
    assert streamed_fields(api, events) == (reasoning, content)


# ---- served: a long answer streamed, and the same answer whole --------------------------------------


@pytest.fixture(scope="module")
def reasoning_server(tmp_path_factory):
    """A tiny random Qwen2 (byte-level tokenizer, a template rendering tools) served with
    deepseek-r1's reasoning parser: its output is reasoning unless the prompt closed the thinking."""
    path = save_tiny_tools_model(tmp_path_factory.mktemp("tiny-stream"), max_position_embeddings=4096)
    with running_server(tmp_path_factory.mktemp("stream-server"), "--model-path", path, "--reasoning-parser", "deepseek-r1") as (url, _):
        yield url


@pytest.mark.parametrize("thinking", [True, False])
def test_a_long_streamed_answer_joins_into_the_whole_answer(reasoning_server: str, thinking: bool):
    client = openai_client(reasoning_server)
    request = {
        "model": "default",
        "messages": [{"role": "user", "content": "Tell me a long story."}],
        "tools": TOOLS,
        "max_tokens": 2000,
        "temperature": 0,
        "extra_body": {"ignore_eos": True, "chat_template_kwargs": {"enable_thinking": thinking}},
    }
    whole = client.chat.completions.create(**request)
    message = whole.choices[0].message
    reasoning, content, chunks = "", "", 0
    for chunk in client.chat.completions.create(**request, stream=True, stream_options={"include_usage": True}):
        if chunk.choices:
            chunks += 1
            content += chunk.choices[0].delta.content or ""
            reasoning += getattr(chunk.choices[0].delta, "reasoning_content", None) or ""
        else:
            assert chunk.usage.completion_tokens == whole.usage.completion_tokens == 2000
    assert chunks > 500  # streamed as it was written, not at the end
    assert (reasoning, content) == (getattr(message, "reasoning_content", None) or "", message.content or "")
    assert len(reasoning if thinking else content) > 1000
