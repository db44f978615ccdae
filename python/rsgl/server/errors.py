"""Errors in OpenAI's shape, `{"error": {"message", "type", "param", "code"}}`, for every endpoint but
Anthropic's (`{"type": "error", "error": {"type", "message"}}` under /v1/messages), and the small
validators that turn a malformed request body into one of them (a 400)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeGuard, overload

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


# ---- request body validation ------------------------------------------------------------------


async def read_json_object(request: Request) -> JsonObject:
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    return body


def is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not a number


def is_str_list(value: Any) -> TypeGuard[list[str]]:
    return isinstance(value, list) and bool(value) and all(isinstance(v, str) for v in value)


def is_text(value: Any) -> TypeGuard[str | list[str]]:
    """One prompt as text or a batch of them."""
    return isinstance(value, str) or is_str_list(value)


def is_token_ids(value: Any) -> TypeGuard[list[int] | list[list[int]]]:
    """One prompt as token ids (a non-empty list of ints) or a batch of them."""
    if not isinstance(value, list) or not value:
        return False
    rows = value if isinstance(value[0], list) else [value]
    return all(isinstance(row, list) and row and all(is_int(t) for t in row) for row in rows)


@overload
def optional_int(body: JsonObject, name: str, default: int, minimum: int | None = None, maximum: int | None = None) -> int: ...
@overload
def optional_int(body: JsonObject, name: str, default: int | None = None, minimum: int | None = None, maximum: int | None = None) -> int | None: ...
def optional_int(body: JsonObject, name: str, default: int | None = None, minimum: int | None = None, maximum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not is_int(value) or (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise bad_request(f"{name} must be an integer{_range_text(minimum, maximum)}, got {value!r}", name)
    return value


@overload
def optional_float(body: JsonObject, name: str, default: float) -> float: ...
@overload
def optional_float(body: JsonObject, name: str, default: float | None = None) -> float | None: ...
def optional_float(body: JsonObject, name: str, default: float | None = None) -> float | None:
    # Ranges are checked by the engine, which knows each sampling parameter's valid values.
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise bad_request(f"{name} must be a number, got {value!r}", name)
    return float(value)


@overload
def optional_bool(body: JsonObject, name: str, default: bool = False) -> bool: ...
@overload
def optional_bool(body: JsonObject, name: str, default: None) -> bool | None: ...
def optional_bool(body: JsonObject, name: str, default: bool | None = False) -> bool | None:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad_request(f"{name} must be true or false, got {value!r}", name)
    return value


def optional_dict(body: JsonObject, name: str) -> JsonObject:
    value = body.get(name)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise bad_request(f"{name} must be an object", name)
    return value


def optional_stop(body: JsonObject) -> list[str] | None:
    stop = body.get("stop")
    if stop is None:
        return None
    if isinstance(stop, str):
        return [stop]
    if isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        return stop
    raise bad_request("stop must be a string or a list of strings", "stop")


def _range_text(minimum: int | None, maximum: int | None) -> str:
    if minimum is not None and maximum is not None:
        return f" between {minimum} and {maximum}"
    if minimum is not None:
        return f" >= {minimum}"
    return f" <= {maximum}" if maximum is not None else ""
