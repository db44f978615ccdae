"""The functions a request offers and the calls a model makes, independent of any model's format."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import orjson

from rsgl._typing import JsonObject


@dataclass(frozen=True)
class Function:
    """One entry of OpenAI's `tools` (type "function")."""

    name: str
    parameters: JsonObject  # the arguments' JSON schema
    description: str | None = None

    def as_tool(self) -> JsonObject:
        """OpenAI's shape, as chat templates expect the `tools` variable."""
        function: JsonObject = {"name": self.name, "parameters": self.parameters}
        if self.description is not None:
            function["description"] = self.description
        return {"type": "function", "function": function}


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=new_call_id)

    @classmethod
    def of(cls, name: Any, arguments: Any) -> ToolCall | None:
        """A call from parsed model output, or None unless the name is a string and the arguments
        an object (or JSON text of one, which some models write)."""
        if isinstance(arguments, str):
            try:
                arguments = orjson.loads(arguments)
            except orjson.JSONDecodeError:
                return None
        if not isinstance(name, str) or not isinstance(arguments, dict):
            return None
        try:
            return cls(name, orjson.dumps(arguments).decode())
        except orjson.JSONEncodeError:  # an integer beyond 64 bits, a lone surrogate
            return None

    @classmethod
    def from_object(cls, value: object, arguments_keys: tuple[str, ...] = ("arguments",)) -> ToolCall | None:
        """A call from a parsed JSON object holding "name" and one of `arguments_keys` (none: no arguments)."""
        if not isinstance(value, dict):
            return None
        return cls.of(value.get("name"), next((value[key] for key in arguments_keys if key in value), {}))

    def as_openai(self) -> JsonObject:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def all_parsed(calls: list[ToolCall | None]) -> list[ToolCall] | None:
    """The calls if every one parsed, else None."""
    parsed = [call for call in calls if call is not None]
    return parsed if len(parsed) == len(calls) else None


def call_schema(functions: list[Function], name_key: str = "name", arguments_key: str = "arguments") -> JsonObject:
    """The JSON schema of one call object: `{name_key: <a function's name>, arguments_key: <its
    arguments>}`, one anyOf branch per function (the name tells the branches apart)."""
    branches = [
        {
            "type": "object",
            "properties": {name_key: {"const": function.name}, arguments_key: closed(function.parameters)},
            "required": [name_key, arguments_key],
            "additionalProperties": False,
        }
        for function in functions
    ]
    return branches[0] if len(branches) == 1 else {"anyOf": branches}


def closed(parameters: JsonObject) -> JsonObject:
    """The parameters schema without room for arguments it does not name, unless it says otherwise:
    still valid against the schema, and a small model no longer makes up arguments until it runs
    out of tokens."""
    if "properties" not in parameters or "additionalProperties" in parameters:
        return parameters
    return {**parameters, "additionalProperties": False}
