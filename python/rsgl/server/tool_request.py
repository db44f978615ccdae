"""The tool fields of a chat request (`tools`, `tool_choice`, `parallel_tool_calls`, and past calls
in assistant messages), checked: malformed ones get a 400 naming the field."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

import orjson

from rsgl._typing import JsonObject
from rsgl.server.errors import bad_request
from rsgl.server.request_body import optional_bool
from rsgl.tools import Function

FUNCTION_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
NO_PARAMETERS: JsonObject = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class ToolRequest:
    offered: list[Function]  # rendered in the prompt and parsed out of the answer; empty: no tools
    forced: list[Function] | None  # the answer must call one of these (tool_choice required or named); None: free
    parallel: bool
    legacy: bool = False  # asked with `functions`: answered with `function_call`, one call


def tool_request(body: JsonObject) -> ToolRequest:
    if body.get("functions") is not None or body.get("function_call") is not None:
        return replace(tool_request(as_tools(body)), legacy=True)
    functions = offered_functions(body)
    parallel = optional_bool(body, "parallel_tool_calls", True)
    choice = body.get("tool_choice") or ("auto" if functions else "none")
    if choice == "none":
        return ToolRequest([], None, parallel)
    if not functions:
        raise bad_request("tool_choice needs tools to choose from", "tool_choice")
    if choice == "auto":
        return ToolRequest(functions, None, parallel)
    if choice == "required":
        return ToolRequest(functions, functions, parallel)
    name = chosen_function_name(choice)
    chosen = [function for function in functions if function.name == name]
    if not chosen:
        raise bad_request(f"tool_choice names the function {name!r}, which is not in tools", "tool_choice")
    return ToolRequest(functions, chosen, parallel)


def as_tools(body: JsonObject) -> JsonObject:
    """OpenAI's deprecated `functions` and `function_call` as the `tools` and `tool_choice` that
    replaced them (one call per answer, as they made)."""
    if body.get("tools") is not None or body.get("tool_choice") is not None:
        raise bad_request("give either functions and function_call (deprecated) or tools and tool_choice, not both", "functions")
    functions = body.get("functions") or []
    if not isinstance(functions, list):
        raise bad_request("functions must be a list of function definitions", "functions")
    choice = body.get("function_call")
    if isinstance(choice, dict):
        choice = {"type": "function", "function": choice}
    elif choice not in (None, "none", "auto"):
        raise bad_request('function_call must be "none", "auto" or {"name": ...}', "function_call")
    return {"tools": [{"type": "function", "function": function} for function in functions], "tool_choice": choice, "parallel_tool_calls": False}


def offered_functions(body: JsonObject) -> list[Function]:
    tools = body.get("tools") or []
    if not isinstance(tools, list):
        raise bad_request("tools must be a list of function tools", "tools")
    functions = [function_of(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    names = [function.name for function in functions]
    if len(set(names)) != len(names):
        raise bad_request("tools name the same function more than once", "tools")
    return functions


def function_of(tool: Any, param: str) -> Function:
    function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if not isinstance(function, dict):
        raise bad_request(f'{param} must be {{"type": "function", "function": {{"name": ..., "parameters": ...}}}}', param)
    name, description = function.get("name"), function.get("description")
    if not isinstance(name, str) or not FUNCTION_NAME.fullmatch(name):
        raise bad_request(f"{param}.function.name must be 1 to 64 letters, digits, underscores or dashes, got {name!r}", param)
    if description is not None and not isinstance(description, str):
        raise bad_request(f"{param}.function.description must be a string", param)
    parameters = function.get("parameters") or NO_PARAMETERS
    if not isinstance(parameters, dict):
        raise bad_request(f"{param}.function.parameters must be a JSON schema object", param)
    return Function(name, parameters, description)


def chosen_function_name(choice: Any) -> str:
    function = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        message = 'tool_choice must be "none", "auto", "required" or {"type": "function", "function": {"name": ...}}'
        raise bad_request(message, "tool_choice")
    name: str = function["name"]
    return name


def modern_message(message: JsonObject, param: str) -> JsonObject:
    """A message of the deprecated function-calling turns in today's shape: an assistant's
    `function_call` as its one tool call, a `function` message's result as a tool's."""
    if message.get("role") == "function":
        return {**message, "role": "tool", "tool_call_id": ""}
    call = message.get("function_call")
    if call is None:
        return message
    if message.get("tool_calls") is not None:
        raise bad_request(f"{param} has both function_call and tool_calls: give one of them", param)
    modern = {key: value for key, value in message.items() if key != "function_call"}
    return {**modern, "tool_calls": [{"id": "", "type": "function", "function": call}]}


def check_past_calls(message: JsonObject, param: str) -> None:
    """An assistant message's `tool_calls`: each a function call whose arguments are JSON text of an object."""
    calls = message.get("tool_calls")
    if calls is None:
        return
    if message["role"] != "assistant" or not isinstance(calls, list):
        raise bad_request(f"{param}.tool_calls must be a list, in an assistant message", param)
    for i, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not is_json_object_text(function.get("arguments")):
            raise bad_request(f'{param}.tool_calls[{i}] must be {{"function": {{"name": ..., "arguments": "<JSON object>"}}}}', param)


def is_json_object_text(text: Any) -> bool:
    try:
        return isinstance(text, str) and isinstance(orjson.loads(text), dict)
    except orjson.JSONDecodeError:
        return False
