"""The Starlette application: routes, API-key check, OpenAI-shaped errors."""

from __future__ import annotations

import asyncio
import secrets
import threading
import time
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager

import anyio
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Receive, Scope, Send

from rsgl.engine import Engine
from rsgl.server import anthropic_api, embeddings_api, native_api, openai_api, openapi, responses_api
from rsgl.server.admission import AdmissionMiddleware
from rsgl.server.chat_tools import ChatParsers
from rsgl.server.errors import EXCEPTION_HANDLERS, APIError
from rsgl.server.logs import DEFAULT_LOG_INTERVAL_SECONDS, log_request, log_steps
from rsgl.server.metrics import ServerMetrics
from rsgl.server.request_images import server_image_limits
from rsgl.server.watchdog import LoopWatchdog

# A request in flight costs no thread (it waits on the event loop), so the bound is about memory.
DEFAULT_MAX_QUEUED_REQUESTS = 4096
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
DEFAULT_WATCHDOG_SECONDS = 10.0
# Threads for the few calls that block (grammar compiles before a stream starts, batch tokenizing,
# cache flushes); requests waiting on the engine need none.
BLOCKING_THREADS = 4
# Load balancers and orchestrators probe health without credentials (as in SGLang).
PATHS_WITHOUT_KEY = ("/health",)


def build_app(
    engine: Engine,
    api_key: str | None = None,
    max_queued_requests: int = DEFAULT_MAX_QUEUED_REQUESTS,
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
    watchdog_seconds: float = DEFAULT_WATCHDOG_SECONDS,
    log_interval: float = DEFAULT_LOG_INTERVAL_SECONDS,
    log_requests: bool = False,
    model_aliases: Sequence[str] = (),
    chat_parsers: ChatParsers | None = None,
    allow_image_urls: bool = False,
) -> Starlette:
    """The HTTP app serving `engine`, which it shuts down when the server stops. With `api_key`,
    requests need `Authorization: Bearer <api_key>` (or `x-api-key: <api_key>`). Beyond `max_queued_requests` generation
    requests in flight, new ones get a 503; bodies over `max_request_bytes` get a 413. An event loop
    blocked for `watchdog_seconds` has every thread's stack logged. Every `log_interval` seconds
    (0: never) what the engine did is logged, if anything; `log_requests` logs each request's end.
    The OpenAI API takes the engine's served model name, `model_aliases` and "default" as `model`;
    `chat_parsers` names its tool-call and reasoning parsers (default: both guessed from the
    template; no reasoning parser but harmony's). Chat image parts are `data:` URLs, and http(s) URLs
    only with `allow_image_urls`."""
    key_check = [Middleware(APIKeyMiddleware, api_key=api_key)] if api_key else []
    admission = Middleware(AdmissionMiddleware, max_in_flight=max_queued_requests, max_body_bytes=max_request_bytes)
    app = Starlette(
        routes=[*native_api.ROUTES, *openai_api.ROUTES, *anthropic_api.ROUTES, *responses_api.ROUTES, *embeddings_api.ROUTES, *openapi.ROUTES],
        middleware=[*key_check, admission],
        exception_handlers=EXCEPTION_HANDLERS,
        lifespan=_lifespan,
    )
    app.state.engine = engine
    app.state.metrics = ServerMetrics(request_ended=log_request if log_requests else None)
    app.state.created = int(time.time())
    app.state.watchdog_seconds = watchdog_seconds
    app.state.log_interval = log_interval
    app.state.model_aliases = list(model_aliases)
    app.state.chat_parsers = chat_parsers or ChatParsers()
    app.state.responses = responses_api.ResponseStore()
    app.state.image_limits = server_image_limits(allow_image_urls)
    return app


def started_executor(threads: int) -> ThreadPoolExecutor:
    """A pool whose threads all run from now on: the process's thread count does not move with load."""
    executor = ThreadPoolExecutor(threads, thread_name_prefix="rsgl-blocking")
    barrier = threading.Barrier(threads)  # each task waits for the others, so each gets a thread of its own
    for started in [executor.submit(barrier.wait) for _ in range(threads)]:
        started.result()
    return executor


@asynccontextmanager
async def _lifespan(app: Starlette) -> AsyncIterator[None]:
    loop = asyncio.get_running_loop()
    loop.set_default_executor(started_executor(BLOCKING_THREADS))
    watchdog = LoopWatchdog(loop, app.state.watchdog_seconds)
    watchdog.start()
    engine: Engine = app.state.engine
    step_log = asyncio.create_task(log_steps(engine.get_server_info, app.state.log_interval)) if app.state.log_interval > 0 else None
    # Starlette streams a response inside an anyio task group, and anyio imports its asyncio backend
    # at the first one: 0.1-0.4 s with the loop blocked while the first streamed request generates,
    # so its first tokens reached the client in one piece. Imported here, before any request.
    async with anyio.create_task_group():
        pass
    yield
    if step_log is not None:
        step_log.cancel()
    watchdog.stop()
    # Aborts the requests still running, so stopping the server does not wait for their generations.
    app.state.engine.shutdown()


class APIKeyMiddleware:
    """Answers 401 to requests without the key, as a bearer token (OpenAI's clients) or in
    `x-api-key` (Anthropic's)."""

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self._key = api_key.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in PATHS_WITHOUT_KEY and not self._authorized(Headers(scope=scope)):
            error = APIError(401, "Missing or invalid API key: send the header Authorization: Bearer <key> (or x-api-key: <key>).", code="invalid_api_key")
            await error.response(scope["path"])(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _authorized(self, headers: Headers) -> bool:
        scheme, _, token = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and secrets.compare_digest(token.strip().encode(), self._key):
            return True
        return secrets.compare_digest(headers.get("x-api-key", "").strip().encode(), self._key)
