"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, for every endpoint but
Anthropic's (`{"type": "error", "error": {"type", "message"}}` under /v1/messages)."""

from __future__ import annotations

from collections.abc import Mapping

import orjson
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import HTTPExceptionHandler

from rsgl._typing import JsonObject
from rsgl.errors import EngineClosedError, InvalidRequestError

INVALID_REQUEST = "invalid_request_error"
ANTHROPIC_PATH = "/v1/messages"  # the Messages API's routes, which answer errors in Anthropic's shape
# Anthropic's error type for each status; others are "api_error".
ANTHROPIC_ERROR_TYPES = {
    400: INVALID_REQUEST, 401: "authentication_error", 403: "permission_error", 404: "not_found_error",
    413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error",
}  # fmt: skip


class APIError(Exception):
    """An error response to send: HTTP status plus OpenAI's error fields."""

    def __init__(self, status_code: int, message: str, type: str = INVALID_REQUEST, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code
        self.message = message
        self.type = type
        self.param = param
        self.code = code

    def body(self, path: str = "") -> JsonObject:
        """The error in the shape of the API `path` belongs to."""
        if path.startswith(ANTHROPIC_PATH):
            return {"type": "error", "error": {"type": ANTHROPIC_ERROR_TYPES.get(self.status_code, "api_error"), "message": self.message}}
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self, path: str, headers: Mapping[str, str] | None = None) -> Response:
        return Response(orjson.dumps(self.body(path)), status_code=self.status_code, headers=headers, media_type="application/json")


class ClientDisconnected(APIError):
    """The client left before its (non-streamed) answer was ready; its request was aborted."""

    def __init__(self) -> None:
        super().__init__(499, "The client closed the connection before the answer was ready.", code="client_closed_request")


class LoraUpdateError(APIError):
    """A refused /load_lora_adapter or /unload_lora_adapter: a 400 whose body holds SGLang's result
    fields (`success`, `error_message`, `loaded_adapters`, which SGLang's clients read) beside the
    API's `error`."""

    def __init__(self, message: str, loaded_adapters: dict[str, str], param: str | None = None) -> None:
        super().__init__(400, message, param=param)
        self.loaded_adapters = loaded_adapters

    def body(self, path: str = "") -> JsonObject:
        return {"success": False, "error_message": self.message, "loaded_adapters": self.loaded_adapters, **super().body(path)}


def bad_request(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


def as_api_error(exc: Exception) -> APIError:
    """The error response for any exception; unexpected ones get a generic message, never their details."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, InvalidRequestError):
        return bad_request(str(exc))
    if isinstance(exc, EngineClosedError):
        return APIError(503, str(exc), type="service_unavailable")
    return APIError(500, "The server hit an internal error while handling the request; see the server log.", type="server_error")


async def handle_exception(request: Request, exc: Exception) -> Response:
    # For the catch-all (Exception) case, Starlette re-raises after this response, so uvicorn logs the traceback.
    return as_api_error(exc).response(request.url.path)


async def handle_http_exception(request: Request, exc: Exception) -> Response:
    """Starlette's own errors: unknown route (404), wrong method (405, with its Allow header)."""
    assert isinstance(exc, HTTPException)  # registered for HTTPException only
    error = APIError(exc.status_code, f"{exc.detail}: {request.method} {request.url.path}")
    return error.response(request.url.path, exc.headers)


EXCEPTION_HANDLERS: dict[type[Exception], HTTPExceptionHandler] = {
    HTTPException: handle_http_exception,
    **{exc: handle_exception for exc in (APIError, InvalidRequestError, EngineClosedError, Exception)},
}
