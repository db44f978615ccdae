"""SGLang's native endpoints (/health, /generate, /get_model_info, /get_server_info), and the plumbing
all endpoints share: JSON responses, server-sent events, and streaming engine calls that never block
the event loop."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from rsgl.engine import Engine
from rsgl.server.errors import (
    as_api_error,
    bad_request,
    is_str_list,
    is_text,
    is_token_ids,
    optional_bool,
    optional_int,
    read_json_object,
)

logger = logging.getLogger("rsgl.server")


def json_response(content: Any) -> Response:
    return Response(orjson.dumps(content), media_type="application/json")


def engine_of(request: Request) -> Engine:
    return request.app.state.engine


class EngineStream:
    """The chunks of one streaming request, each pulled by the request's own worker thread so the
    event loop never waits on the engine. `close()` aborts the request if it has not finished."""

    def __init__(self, chunks: Iterator[dict], worker: ThreadPoolExecutor) -> None:
        self._chunks = chunks
        self._worker = worker

    @classmethod
    async def start(cls, engine: Engine, **generate_kwargs: Any) -> EngineStream:
        """Submits the request; a bad one raises here, before the response has started."""
        worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rsgl-stream")
        try:
            chunks = await asyncio.get_running_loop().run_in_executor(worker, partial(engine.generate, stream=True, **generate_kwargs))
        except BaseException:
            worker.shutdown(wait=False)
            raise
        return cls(chunks, worker)

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> dict:
        chunk = await asyncio.get_running_loop().run_in_executor(self._worker, next, self._chunks, None)
        if chunk is None:
            raise StopAsyncIteration
        return chunk

    def close(self) -> None:
        # Queued on the same thread, behind any pending next(): a running generator cannot be closed.
        self._worker.submit(self._chunks.close)
        self._worker.shutdown(wait=False)


class EventStreamResponse(StreamingResponse):
    """Server-sent events, `data: {json}\\n\\n` per payload and `data: [DONE]\\n\\n` at the end.

    However the response ends (finished, failed, or cancelled by Starlette because the client went
    away), the engine stream gets closed, which aborts an unfinished request."""

    def __init__(self, payloads: AsyncIterator[dict], stream: EngineStream) -> None:
        super().__init__(_sse_events(payloads), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._stream.close()


def sse_event(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def _sse_events(payloads: AsyncIterator[dict]) -> AsyncIterator[bytes]:
    try:
        async for payload in payloads:
            yield sse_event(payload)
    except Exception as exc:  # the 200 status is already sent: report the error in-band, as OpenAI does
        error = as_api_error(exc)
        if error.status_code >= 500:
            logger.exception("streaming response failed")
        yield sse_event(error.body())
    yield b"data: [DONE]\n\n"


# ---- endpoints ----------------------------------------------------------------------------------


async def health(request: Request) -> Response:
    return Response(status_code=200)


async def get_model_info(request: Request) -> Response:
    engine = engine_of(request)
    return json_response({"model_path": engine.model.source, "served_model_name": engine.served_model_name, "is_generation": True})


async def get_server_info(request: Request) -> Response:
    return json_response(engine_of(request).get_server_info())


async def flush_cache(request: Request) -> Response:
    """Empties the prefix cache; refused while requests are in flight (as SGLang does)."""
    if not await asyncio.to_thread(engine_of(request).flush_cache):
        raise bad_request("The cache was not flushed: requests are running or waiting; retry when the server is idle.")
    return Response("Cache flushed.\n", media_type="text/plain")


async def generate(request: Request) -> Response:
    """SGLang's /generate: the response is what `Engine.generate` returns; streaming sends its
    chunks (cumulative text) as server-sent events."""
    body = await read_json_object(request)
    engine = engine_of(request)
    arguments = generate_arguments(body)
    if optional_bool(body, "stream"):
        stream = await EngineStream.start(engine, **arguments)
        return EventStreamResponse(stream, stream)
    return json_response(await engine.async_generate(**arguments))


def generate_arguments(body: dict) -> dict:
    """`Engine.generate` keyword arguments from a /generate body, type-checked (values by the engine)."""
    text, input_ids = body.get("text"), body.get("input_ids")
    if (text is None) == (input_ids is None):
        raise bad_request("Give exactly one of text or input_ids.")
    if text is not None and not is_text(text):
        raise bad_request("text must be a string or a list of strings", "text")
    if input_ids is not None and not is_token_ids(input_ids):
        raise bad_request("input_ids must be a list of token ids or a list of such lists", "input_ids")
    sampling_params = body.get("sampling_params")
    if not (sampling_params is None or isinstance(sampling_params, dict) or _is_dict_list(sampling_params)):
        raise bad_request("sampling_params must be an object, or a list of objects (one per prompt)", "sampling_params")
    rid = body.get("rid")
    if not (rid is None or isinstance(rid, str) or is_str_list(rid)):
        raise bad_request("rid must be a string or a list of strings (one per prompt)", "rid")
    return {
        "prompt": text,
        "input_ids": input_ids,
        "sampling_params": sampling_params,
        "return_logprob": optional_bool(body, "return_logprob"),
        "top_logprobs_num": optional_int(body, "top_logprobs_num", 0, minimum=0),
        "rid": rid,
    }


def _is_dict_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, dict) for v in value)


ROUTES = [
    Route("/health", health, methods=["GET"]),
    Route("/get_model_info", get_model_info, methods=["GET"]),
    Route("/get_server_info", get_server_info, methods=["GET"]),
    Route("/generate", generate, methods=["POST"]),
    Route("/flush_cache", flush_cache, methods=["GET", "POST"]),
]
