"""Reading a request's JSON body: the small validators that turn a malformed field into a 400
naming it, in the API's error shape (rsgl.server.errors)."""

from __future__ import annotations

from typing import Any, TypeGuard, overload

import orjson
from starlette.requests import Request

from rsgl._typing import JsonObject
from rsgl.server.errors import bad_request


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
