"""Reading `tools`, `tool_choice` and `response_format` of a chat request, and choosing the
function an answer calls."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from .apierror import ApiError

FUNCTION_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
TOOL_CHOICES = ("none", "auto", "required")
RESPONSE_FORMATS = ("text", "json_object", "json_schema")



@dataclass(frozen=True)
class Tool:
    """One function from `tools`: its name and its JSON-Schema `parameters`."""

    name: str
    parameters: dict[str, Any]



def read_tools(body: dict[str, Any]) -> list[Tool]:
    tools = body.get("tools")
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise ApiError(400, "Invalid type for 'tools': expected an array of tool objects.",
                       param="tools", code="invalid_type")
    if not tools:
        raise ApiError(400, "Invalid 'tools': empty array. Give at least one tool, or leave "
                       "'tools' out.", param="tools", code="invalid_value")
    out: list[Tool] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise ApiError(400, f"Invalid type for '{where}': expected an object like "
                           '{"type": "function", "function": {"name": ...}}.', param=where,
                           code="invalid_type")
        if tool.get("type") != "function":
            raise ApiError(400, f"Invalid value for '{where}.type': expected 'function'.",
                           param=f"{where}.type", code="invalid_value")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise ApiError(400, f"Missing or invalid '{where}.function': expected an object "
                           "with 'name' and optional 'description' and 'parameters'.",
                           param=f"{where}.function", code="invalid_value")
        out.append(_read_function(f"{where}.function", function))
    names = [t.name for t in out]
    for name in names:
        if names.count(name) > 1:
            raise ApiError(400, f"Invalid 'tools': the function name '{name}' is used twice.",
                           param="tools", code="invalid_value")
    return out


def _read_function(where: str, function: dict[str, Any]) -> Tool:
    name = function.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME_RE.match(name):
        raise ApiError(400, f"Invalid '{where}.name': expected 1 to 64 letters, digits, "
                       f"underscores or dashes, got {name!r}.", param=f"{where}.name",
                       code="invalid_value")
    _check_type(function, where, "description", str, "a string")
    parameters = function.get("parameters", {})
    if parameters is None:
        parameters = {}
    if not isinstance(parameters, dict):
        raise ApiError(400, f"Invalid type for '{where}.parameters': expected a JSON Schema "
                       "object.", param=f"{where}.parameters", code="invalid_type")
    if "type" in parameters and parameters["type"] != "object":
        raise ApiError(400, f"Invalid '{where}.parameters': the schema's type must be "
                       f"'object', got {parameters['type']!r}.", param=f"{where}.parameters",
                       code="invalid_value")
    _check_type(function, where, "strict", bool, "a boolean")
    return Tool(name=name, parameters=parameters)


def _check_type(function: dict[str, Any], where: str, key: str, kind: type, noun: str) -> None:
    """An optional field of a function must be of `kind` when it is there."""
    value = function.get(key)
    if value is not None and not isinstance(value, kind):
        raise ApiError(400, f"Invalid type for '{where}.{key}': expected {noun}.",
                       param=f"{where}.{key}", code="invalid_type")


def read_tool_choice(body: dict[str, Any], tools: list[Tool]) -> str | Tool:
    choice = body.get("tool_choice")
    if choice is None:
        return "auto" if tools else "none"
    if choice == "none":
        return "none"
    if not tools:
        raise ApiError(400, "Invalid 'tool_choice': it is only allowed when 'tools' are "
                       "given.", param="tool_choice", code="invalid_value")
    if isinstance(choice, str):
        if choice not in TOOL_CHOICES:
            raise ApiError(400, f"Invalid value for 'tool_choice': expected one of "
                           f"{', '.join(TOOL_CHOICES)} or a named function, got {choice!r}.",
                           param="tool_choice", code="invalid_value")
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(choice, dict) or choice.get("type") != "function" or not isinstance(
        name, str
    ):
        raise ApiError(400, "Invalid 'tool_choice': expected 'none', 'auto', 'required' or "
                       '{"type": "function", "function": {"name": "..."}}.',
                       param="tool_choice", code="invalid_value")
    for tool in tools:
        if tool.name == name:
            return tool
    raise ApiError(400, f"Invalid 'tool_choice': no function named '{name}' in 'tools' "
                   f"(given: {', '.join(t.name for t in tools)}).", param="tool_choice",
                   code="invalid_value")


def choose_tool(tools: list[Tool], choice: str | Tool,
                messages: list[tuple[str, str]]) -> Tool | None:
    """The function an answer calls. A named choice calls it; "required" calls the first
    tool whose name the last user message contains, else the first tool; "auto" calls a tool
    only when the last message is the user's and contains a tool's name (case-insensitive,
    first tool in `tools` order); "none" never calls one."""
    if isinstance(choice, Tool):
        return choice
    if choice == "none" or not tools:
        return None
    last_role, last_text = messages[-1]
    asked = None
    if last_role == "user":
        text = last_text.lower()
        asked = next((t for t in tools if t.name.lower() in text), None)
    if choice == "required":
        return asked or tools[0]
    return asked


def read_response_format(body: dict[str, Any]) -> tuple[str | None, dict[str, Any] | None]:
    fmt = body.get("response_format")
    if fmt is None:
        return None, None
    kind = fmt.get("type") if isinstance(fmt, dict) else None
    if kind not in RESPONSE_FORMATS:
        raise ApiError(400, "Invalid 'response_format': expected an object with 'type' one of "
                       f"{', '.join(RESPONSE_FORMATS)}.", param="response_format",
                       code="invalid_value")
    if kind == "text":
        return None, None
    if kind == "json_object":
        return "json_object", None
    spec = fmt.get("json_schema")
    if not isinstance(spec, dict):
        raise ApiError(400, "Invalid 'response_format.json_schema': expected an object with "
                       "'name' and 'schema'.", param="response_format.json_schema",
                       code="invalid_value")
    name = spec.get("name")
    if not isinstance(name, str) or not FUNCTION_NAME_RE.match(name):
        raise ApiError(400, "Invalid 'response_format.json_schema.name': expected 1 to 64 "
                       f"letters, digits, underscores or dashes, got {name!r}.",
                       param="response_format.json_schema.name", code="invalid_value")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict):
        raise ApiError(400, "Invalid type for 'response_format.json_schema.schema': expected "
                       "a JSON Schema object.", param="response_format.json_schema.schema",
                       code="invalid_type")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise ApiError(400, "Invalid type for 'response_format.json_schema.strict': expected "
                       "a boolean.", param="response_format.json_schema.strict",
                       code="invalid_type")
    return "json_schema", schema
