"""Server-sent events: a stream's payloads as `data:` events (OpenAI's dialect, ending in
`[DONE]`) or named events (Anthropic's and the Responses API's), with an error that happens after
the response has started reported in-band."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import orjson
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

from rsgl._typing import JsonObject
from rsgl.server.engine_calls import EngineStream
from rsgl.server.errors import APIError, as_api_error

logger = logging.getLogger("rsgl.server")


@dataclass(frozen=True)
class EventDialect:
    """How an API writes server-sent events: `data:` lines ending with `data: [DONE]` (OpenAI's
    chat and completions, SGLang's), or events named by their payload's `type` with no end marker
    (Anthropic's Messages, OpenAI's Responses); and the payload of an error once the stream began."""

    named: bool
    error: Callable[[APIError], JsonObject]

    def event(self, payload: JsonObject) -> bytes:
        return (b"event: " + payload["type"].encode() + b"\n" if self.named else b"") + sse_event(payload)


DATA_EVENTS = EventDialect(named=False, error=lambda error: error.body())


class EventStreamResponse(StreamingResponse):
    """Server-sent events of `payloads`, in `dialect`.

    However the response ends (finished, failed, or cancelled by Starlette because the client went
    away), the engine stream gets closed, which aborts an unfinished request."""

    def __init__(self, payloads: AsyncIterator[JsonObject], stream: EngineStream, dialect: EventDialect = DATA_EVENTS) -> None:
        super().__init__(_sse_events(payloads, dialect), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._stream.aclose()


def sse_event(payload: Any) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


async def _sse_events(payloads: AsyncIterator[JsonObject], dialect: EventDialect) -> AsyncIterator[bytes]:
    try:
        async for payload in payloads:
            yield dialect.event(payload)
    except Exception as exc:  # the 200 status is already sent: report the error in-band, as OpenAI and Anthropic do
        error = as_api_error(exc)
        if error.status_code >= 500:
            logger.exception("streaming response failed")
        yield dialect.event(dialect.error(error))
    if not dialect.named:
        yield b"data: [DONE]\n\n"
