"""Rendering a model's chat template (Jinja), in the same sandbox and with the same helpers as
transformers' `apply_chat_template`, so prompts come out identical.

Models without a chat template get `CHATML_TEMPLATE`: plain ChatML
(`<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, then `<|im_start|>assistant\\n`).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any, NoReturn

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from rsgl._typing import JsonObject
from rsgl.errors import InvalidRequestError

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def render_chat(
    template: str | None,
    messages: list[JsonObject],
    *,
    add_generation_prompt: bool = True,
    bos_token: str | None = None,
    eos_token: str | None = None,
    tools: list[JsonObject] | None = None,
    **extra: Any,
) -> str:
    """The prompt text for `messages`, rendered with `template` (None: `CHATML_TEMPLATE`).

    `extra` reaches the template as variables (e.g. `enable_thinking=False`). A template error
    (including the template's own `raise_exception(...)`) raises InvalidRequestError.
    """
    # Unset special tokens stay undefined, which Jinja renders as "" (passing None would print "None").
    special_tokens = {name: value for name, value in (("bos_token", bos_token), ("eos_token", eos_token)) if value is not None}
    try:
        return _compile(template or CHATML_TEMPLATE).render(
            messages=messages, tools=tools, add_generation_prompt=add_generation_prompt, **special_tokens, **extra
        )
    except jinja2.TemplateError as error:
        raise InvalidRequestError(f"the chat template rejected these messages: {error.message or error}") from error


@functools.lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    try:
        return _environment().from_string(template)
    except jinja2.TemplateSyntaxError as error:
        message = f"the chat template is not valid Jinja ({error}); pass a corrected template."
        raise InvalidRequestError(message) from error


@functools.cache
def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols])
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    environment.globals["strftime_now"] = _strftime_now
    return environment


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None, separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Jinja's own tojson escapes HTML characters (<, >, &), which would change the prompt.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise_exception(message: str) -> NoReturn:
    raise jinja2.exceptions.TemplateError(message)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class _GenerationTag(Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks in some
    templates; for inference it renders its body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body, lineno=lineno)
