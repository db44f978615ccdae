"""What a program appends to its state: text, `gen` (generate into a variable), `select` (pick
one of several continuations by log-probability) and role blocks. They concatenate with text and
with each other in either order, as in SGLang: `s += "A: " + gen("answer") + "\n"`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeGuard, cast

from rsgl._typing import JsonObject
from rsgl.errors import InvalidRequestError


class Concatenable:
    """`a + b` with text or another expression on either side gives a `Concat` of both, appended
    part by part (so a `gen` inside sees the text before it as its prompt)."""

    def __add__(self, other: object) -> Concat:
        if not is_expression(other):
            return NotImplemented
        return Concat(parts(self) + parts(other))

    def __radd__(self, other: object) -> Concat:
        if not is_expression(other):
            return NotImplemented
        return Concat(parts(other) + parts(self))


@dataclass(frozen=True)
class Gen(Concatenable):
    name: str | None
    sampling_params: JsonObject


@dataclass(frozen=True)
class Select(Concatenable):
    name: str | None
    choices: tuple[str, ...]


@dataclass(frozen=True)
class Role(Concatenable):
    role: str
    content: tuple[Expression, ...] = field(default=())


@dataclass(frozen=True)
class Concat(Concatenable):
    parts: tuple[Expression, ...]


Expression = str | Gen | Select | Role | Concat


def is_expression(value: object) -> TypeGuard[Expression]:
    return isinstance(value, str | Concatenable)


def parts(expression: Expression | Concatenable) -> tuple[Expression, ...]:
    """A concatenation's parts, flattened; any other expression is its own single part."""
    return expression.parts if isinstance(expression, Concat) else (cast(Expression, expression),)


def gen(
    name: str | None = None,
    max_tokens: int | None = None,
    stop: str | list[str] | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    regex: str | None = None,
    json_schema: JsonObject | str | None = None,
    choices: list[str] | None = None,
    **sampling_params: Any,
) -> Gen | Select:
    """Generates text into the variable `name` (read it back with `s[name]`). The arguments are
    SGLang's sampling parameters (`max_tokens` is `max_new_tokens`); `regex` or `json_schema`
    constrain the output. Unset ones keep the program's defaults (`run(temperature=...)`), else
    the backend's. With `choices` it is `select(name, choices)`, as in SGLang."""
    if choices is not None:
        return select(name, choices)
    named = {
        "max_new_tokens": max_tokens,
        "stop": stop,
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "regex": regex,
        "json_schema": json_schema,
    }
    return Gen(name, {k: v for k, v in {**named, **sampling_params}.items() if v is not None})


def select(name: str | None = None, choices: list[str] | None = None) -> Select:
    """Appends whichever of `choices` the model finds likeliest after the text so far, by the
    mean log-probability of its tokens (SGLang's length-normalized choice), and stores it in `name`."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        raise InvalidRequestError("select needs a non-empty list of non-empty choice strings")
    return Select(name, tuple(choices))


def _role(role: str) -> Callable[..., Role]:
    def block(*content: Expression) -> Role:
        return Role(role, content)

    block.__name__ = role
    block.__doc__ = f'A {role} turn rendered with the model\'s chat template: `s += {role}("text", gen(...))`, or `with s.{role}(): ...`.'
    return block


system = _role("system")
user = _role("user")
assistant = _role("assistant")
