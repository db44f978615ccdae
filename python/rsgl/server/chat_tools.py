"""What tools and reasoning change in a chat request: the prompt (tools rendered), the grammar
that forces calls, and how the answer is read back."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import orjson

from rsgl._typing import JsonObject
from rsgl.engine import Engine, json_schema_warnings
from rsgl.errors import InvalidRequestError
from rsgl.server.chat_reader import ChatReader
from rsgl.server.errors import bad_request
from rsgl.server.reasoning import REASONING_PARSERS, ReasoningSplitter, reasoning_parser_for_template
from rsgl.server.tool_request import ToolRequest
from rsgl.tools import FORMATS, Function, ToolCallFormat, format_for_template, messages_for_template, template_renders_tools


@dataclass(frozen=True)
class ChatParsers:
    """The server's `--tool-call-parser` (None: guessed from the chat template) and
    `--reasoning-parser` (None: guessed from the chat template for models that always reason in
    their own format, else the reasoning stays in the content)."""

    tool_call_parser: str | None = None
    reasoning_parser: str | None = None

    def call_format(self, template: str | None) -> ToolCallFormat:
        return FORMATS[self.tool_call_parser].for_template(template) if self.tool_call_parser else format_for_template(template)

    def reasoning(self, template: str | None, prompt: str) -> ReasoningSplitter | None:
        parser = self.reasoning_parser or reasoning_parser_for_template(template)
        return REASONING_PARSERS[parser](prompt) if parser else None


@dataclass(frozen=True)
class PreparedChat:
    prompt: str
    constraint: JsonObject  # grammar sampling params forcing the calls; empty unless they are forced
    sampling_overrides: JsonObject  # e.g. keeping special tokens that mark calls
    reader: ChatReader


async def prepare_chat(engine: Engine, messages: list[JsonObject], tools: ToolRequest, parsers: ChatParsers, template_kwargs: JsonObject) -> PreparedChat:
    template = engine.model.chat_template
    call_format = parsers.call_format(template)
    messages, tools_variable = messages_for_template(messages, tools.offered, call_format, template_renders_tools(template))
    prompt = engine.apply_chat_template(messages, tools=tools_variable, **template_kwargs)
    constraint = {} if tools.forced is None else call_format.constraint(tools.forced, tools.parallel)
    if tools.forced is not None:
        report_relaxed_parameters(engine, tools.forced)
        await check_compiles(engine, constraint)
    reasoning = parsers.reasoning(template, prompt)
    keeps_special_tokens = (tools.offered and call_format.keeps_special_tokens) or (reasoning is not None and reasoning.keeps_special_tokens)
    overrides = {"skip_special_tokens": False} if keeps_special_tokens else {}
    return PreparedChat(prompt, constraint, overrides, ChatReader(call_format if tools.offered else None, reasoning, tools.legacy))


def report_relaxed_parameters(engine: Engine, functions: list[Function]) -> None:
    """Forced calls follow each function's parameters schema as the schema policy has it (see
    lark_json): what the grammar relaxes is logged, or refused by a --strict-json-schema server."""
    for function in functions:
        warnings = json_schema_warnings(orjson.dumps(function.parameters).decode())
        if warnings and engine.strict_json_schema:
            listed = "; ".join(f"`{w['keyword']}` at {w['pointer'] or 'the root'}: {w['action']}" for w in warnings)
            raise bad_request(f"strict mode refuses what the grammar cannot enforce exactly in the parameters of {function.name}: {listed}", "tools")


async def check_compiles(engine: Engine, constraint: JsonObject) -> None:
    """Compiles the forced-call grammar off the event loop (cached for the request), so a parameters
    schema the grammar engine refuses is the client's error about `tools`."""
    try:
        await asyncio.get_running_loop().run_in_executor(None, engine.check_grammar, constraint)
    except InvalidRequestError as exc:
        raise bad_request(f"the tools' parameters schemas cannot be enforced: {exc}", "tools") from None
