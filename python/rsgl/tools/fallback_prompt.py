"""Chat messages ready for a template, with tools. Templates that render tools (most recent ones
take a `tools` variable) get them as OpenAI sends them. For templates that do not (such as
SmolLM2's plain ChatML), rsgl writes the tools itself, as vLLM and SGLang do: a system block listing
the functions as JSON and showing how to call them in the parser's format; past calls written in
that format in the assistant's turn; tool results as user turns wrapped in <tool_response> tags."""

from __future__ import annotations

import re

import orjson

from rsgl._typing import JsonObject
from rsgl.tools.calls import Function, ToolCall
from rsgl.tools.formats.base import ToolCallFormat

MENTIONS_TOOLS = re.compile(r"\btools\b")
EXAMPLE_CALL = ToolCall("function_name", '{"argument_name": "value"}')


def template_renders_tools(template: str | None) -> bool:
    return template is not None and MENTIONS_TOOLS.search(template) is not None


def messages_for_template(
    messages: list[JsonObject], functions: list[Function], call_format: ToolCallFormat, renders_tools: bool
) -> tuple[list[JsonObject], list[JsonObject] | None]:
    """(messages, the template's `tools` variable) for `messages` offering `functions` (none: tools
    are not offered, though past calls and results still render)."""
    if renders_tools:
        return [with_parsed_arguments(message) for message in messages], [function.as_tool() for function in functions] or None
    written = [written_out(message, call_format) for message in messages]
    return (with_instructions(written, functions, call_format) if functions else written), None


def with_parsed_arguments(message: JsonObject) -> JsonObject:
    """Templates write a past call's arguments with `tojson`: they need the object, not OpenAI's JSON
    text. An empty or null `tool_calls` is dropped: templates test for the key (gpt-oss's does)."""
    if not message.get("tool_calls"):
        return {key: value for key, value in message.items() if key != "tool_calls"}
    calls = [{**call, "function": {**call["function"], "arguments": orjson.loads(call["function"]["arguments"])}} for call in message["tool_calls"]]
    return {**message, "tool_calls": calls}


def written_out(message: JsonObject, call_format: ToolCallFormat) -> JsonObject:
    """`message` in roles any template renders: past calls as text, tool results as user turns."""
    if message["role"] == "tool":
        return {"role": "user", "content": f"<tool_response>\n{message['content']}\n</tool_response>"}
    if message.get("tool_calls"):
        calls = [ToolCall(call["function"]["name"], call["function"]["arguments"]) for call in message["tool_calls"]]
        content = "\n".join(part for part in (message["content"], call_format.write(calls)) if part)
        return {"role": message["role"], "content": content}
    return message


def with_instructions(messages: list[JsonObject], functions: list[Function], call_format: ToolCallFormat) -> list[JsonObject]:
    """`messages` with the tools described at the end of the system message (one is added if none)."""
    signatures = "\n".join(orjson.dumps(function.as_tool()["function"]).decode() for function in functions)
    instructions = (
        "# Tools\n\nYou may call one or more functions to answer. Their signatures, as JSON:\n"
        f"{signatures}\n\nTo call functions, answer with the calls only, written as:\n{call_format.write([EXAMPLE_CALL])}"
    )
    if messages[0]["role"] == "system":
        return [{**messages[0], "content": f"{messages[0]['content']}\n\n{instructions}".lstrip()}, *messages[1:]]
    return [{"role": "system", "content": instructions}, *messages]
