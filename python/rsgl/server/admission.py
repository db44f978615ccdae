"""Admission control: a bound on generation requests in flight (503 with Retry-After beyond it) and
on request body size (413), checked before a request reaches its endpoint."""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from rsgl.server.errors import APIError

# Only these hold engine capacity; probes and information endpoints stay answerable under load.
GENERATION_PATHS = frozenset({"/generate", "/v1/completions", "/v1/chat/completions", "/v1/messages", "/v1/responses", "/encode", "/v1/embeddings"})
RETRY_AFTER_SECONDS = 1


class AdmissionMiddleware:
    def __init__(self, app: ASGIApp, max_in_flight: int, max_body_bytes: int) -> None:
        self.app = app
        self.max_in_flight = max_in_flight
        self.max_body_bytes = max_body_bytes
        self.in_flight = 0  # changed only on the event loop

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._declared_size(scope) > self.max_body_bytes:
            await self._too_large().response(scope["path"])(scope, receive, send)
            return
        receive = self._size_limited(receive)
        if scope["path"] not in GENERATION_PATHS:
            await self.app(scope, receive, send)
            return
        if self.in_flight >= self.max_in_flight:
            await self._overloaded().response(scope["path"], {"Retry-After": str(RETRY_AFTER_SECONDS)})(scope, receive, send)
            return
        self.in_flight += 1
        try:
            await self.app(scope, receive, send)  # until the response, streamed or not, has ended
        finally:
            self.in_flight -= 1

    @staticmethod
    def _declared_size(scope: Scope) -> int:
        length = Headers(scope=scope).get("content-length", "")
        return int(length) if length.isdigit() else 0

    def _size_limited(self, receive: Receive) -> Receive:
        """`receive` that fails with a 413 once a body without (or beyond) a Content-Length grows too big."""
        received = 0

        async def receive_within_limit() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.max_body_bytes:
                raise self._too_large()  # raised inside the endpoint's body read, so answered as an APIError
            return message

        return receive_within_limit

    def _too_large(self) -> APIError:
        return APIError(413, f"The request body is larger than the limit of {self.max_body_bytes} bytes.", code="request_too_large")

    def _overloaded(self) -> APIError:
        message = f"The server is handling its limit of {self.max_in_flight} requests; retry after {RETRY_AFTER_SECONDS} s."
        return APIError(503, message, type="server_overloaded")
