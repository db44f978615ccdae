"""An endpoint's call into the engine, whole or streamed: counted and timed in the metrics, awaited
on the event loop (no thread per request), and aborted when the client goes away."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable
from typing import Any, TypedDict

from starlette.requests import Request

from rsgl._typing import JsonObject
from rsgl.engine import Engine
from rsgl.server.errors import ClientDisconnected
from rsgl.server.metrics import RequestTracker, ServerMetrics
from rsgl.vision.images import ImageSource


def engine_of(request: Request) -> Engine:
    engine: Engine = request.app.state.engine
    return engine


def metrics_of(request: Request) -> ServerMetrics:
    metrics: ServerMetrics = request.app.state.metrics
    return metrics


class GenerateArguments(TypedDict, total=False):
    """`Engine.generate` keyword arguments an endpoint passes on."""

    prompt: str | list[str] | None
    input_ids: list[int] | list[list[int]] | None
    sampling_params: JsonObject | list[JsonObject] | None
    return_logprob: bool
    top_logprobs_num: int
    logprob_start_len: int | None
    rid: str | list[str] | None
    image_data: list[ImageSource] | list[list[ImageSource]] | None  # decoded images for the prompts' image placeholders
    lora_path: str | list[str | None] | None  # the LoRA adapter of every prompt, or of each


class EngineStream:
    """The chunks of one streaming request, awaited on the event loop (no thread per stream):
    each holding what it adds to the output (`Engine._async_generate_deltas`), or, `cumulative`,
    the whole output so far (SGLang's /generate). `aclose()` aborts the request if it has not finished."""

    def __init__(self, chunks: AsyncGenerator[JsonObject, None], tracker: RequestTracker) -> None:
        self._chunks = chunks
        self._tracker = tracker

    @classmethod
    async def start(cls, request: Request, arguments: GenerateArguments, cumulative: bool = False) -> EngineStream:
        """Submits the request; a bad one raises here, before the response has started."""
        tracker = metrics_of(request).track()
        engine = engine_of(request)
        try:
            chunks = await (engine.async_generate(stream=True, **arguments) if cumulative else engine._async_generate_deltas(**arguments))
        except BaseException as exc:
            tracker.end(exc)
            raise
        return cls(chunks, tracker)

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> JsonObject:
        try:
            chunk = await anext(self._chunks)
        except StopAsyncIteration:
            raise  # the end of the stream, not a failure
        except Exception as exc:
            self._tracker.end(exc)
            raise
        self._tracker.streamed(chunk)
        return chunk

    async def aclose(self) -> None:
        self._tracker.end()
        await self._chunks.aclose()


async def generate_whole(request: Request, arguments: GenerateArguments) -> JsonObject | list[JsonObject]:
    """`Engine.async_generate` (not streamed), counted and timed in the metrics. A client that
    leaves before the answer is ready has its request aborted."""
    with metrics_of(request).track() as tracker:
        outputs: JsonObject | list[JsonObject] = await _unless_client_leaves(request, engine_of(request).async_generate(**arguments))
        tracker.note_outputs(outputs if isinstance(outputs, list) else [outputs])
    return outputs


async def _unless_client_leaves(request: Request, work: Awaitable[Any]) -> Any:
    task = asyncio.ensure_future(work)
    left = asyncio.ensure_future(_client_left(request))
    try:
        await asyncio.wait({task, left}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        left.cancel()
    if task.done():
        return task.result()
    task.cancel()  # the Engine aborts a request whose waiting task is cancelled
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ClientDisconnected()


async def _client_left(request: Request) -> None:
    """Returns when the client disconnects: once the body is read, the server's next message is
    the disconnect (this waits on it, where polling would wake every request four times a second)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
