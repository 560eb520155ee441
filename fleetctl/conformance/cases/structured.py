"""The structured-output cases: tool calls and response_format (JSON object, JSON schema)."""

from __future__ import annotations

import json
from typing import Any

import jsonschema

from fleetctl.conformance.cases.probe import (
    CITY_SCHEMA,
    FAIL,
    PASS,
    TIME_TOOL,
    WEATHER_TOOL,
    Outcome,
    Probe,
)
from fleetctl.conformance.cases.registry import (
    _content,
    _first_choice,
    _json,
    _not_ok,
    _outcome,
    case,
)


def _tool_calls_judge(probe: Probe, expected: str, tool_choice: Any,
                      want_name: str | None) -> Outcome:
    schemas = {t["function"]["name"]: t["function"]["parameters"]  # type: ignore[index]
               for t in (WEATHER_TOOL, TIME_TOOL)}
    request, answer = probe.chat(
        messages=[{"role": "user", "content": "What is the weather in Paris, and what time "
                                              "is it in Tokyo?"}],
        tools=[WEATHER_TOOL, TIME_TOOL], tool_choice=tool_choice, max_tokens=128)
    body = _json(answer)
    if answer.status_code != 200:
        return _not_ok(expected, request, answer)
    choice = _first_choice(body) or {}
    calls = (choice.get("message") or {}).get("tool_calls")
    if not isinstance(calls, list) or not calls:
        content = _content(body)
        got = "no tool_calls" + (f"; the content is text: {content[:100]!r}" if content else "")
        return _outcome(FAIL, expected, got, brief="no tool_calls", request=request,
                        answer=answer, finish_reason=choice.get("finish_reason"))
    problems = []
    for index, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or call.get("type") != "function" or not call.get("id"):
            problems.append(f"tool_calls[{index}] lacks id, type function or function")
            continue
        name = fn.get("name")
        if name not in schemas:
            problems.append(f"tool_calls[{index}] calls unknown function {name!r}")
            continue
        if want_name and name != want_name:
            problems.append(f"tool_calls[{index}] calls {name}, not the named {want_name}")
        try:
            arguments = json.loads(fn.get("arguments") or "")
        except (TypeError, ValueError):
            problems.append(f"{name}'s arguments are not JSON: {str(fn.get('arguments'))[:80]!r}")
            continue
        try:
            jsonschema.validate(arguments, schemas[name])
        except jsonschema.ValidationError as exc:
            problems.append(f"{name}'s arguments do not fit its parameters: {exc.message}")
    if problems:
        return _outcome(FAIL, expected, "; ".join(problems), request=request, answer=answer,
                        brief=problems[0], finish_reason=choice.get("finish_reason"))
    names = ", ".join(c["function"]["name"] for c in calls)
    return _outcome(PASS, expected, f"tool_calls: {names}, arguments valid JSON per schema "
                    f"(finish_reason {choice.get('finish_reason')})", request=request,
                    answer=answer, finish_reason=choice.get("finish_reason"))


@case("tools.required", "Tools with tool_choice \"required\"",
      short="tools, tool_choice required", required=True,
      sends="two function tools (get_weather, get_time), tool_choice: \"required\"",
      judges="message.tool_calls present; each calls one of the tools with arguments that "
             "parse as JSON and validate against its parameters schema",
      expected="tool_calls with JSON arguments valid per the parameters schema")
def tools_required(probe: Probe, expected: str) -> Outcome:
    return _tool_calls_judge(probe, expected, "required", None)


@case("tools.named", "Tools with a named function in tool_choice",
      short="tools, named function", required=True,
      sends="the same tools, tool_choice: {type: function, function: {name: get_time}}",
      judges="message.tool_calls call get_time, with arguments valid against its schema",
      expected="a get_time tool call with arguments valid per its schema")
def tools_named(probe: Probe, expected: str) -> Outcome:
    return _tool_calls_judge(
        probe, expected, {"type": "function", "function": {"name": "get_time"}}, "get_time")


def _json_content_judge(probe: Probe, expected: str, response_format: dict[str, Any],
                        schema: dict[str, Any] | None) -> Outcome:
    request, answer = probe.chat(
        messages=[{"role": "user", "content": "Describe Lyon as JSON with city, country "
                                              "and population."}],
        response_format=response_format, max_tokens=200)
    body = _json(answer)
    if answer.status_code != 200:
        return _not_ok(expected, request, answer)
    content = _content(body)
    try:
        parsed = json.loads(content or "")
    except ValueError:
        return _outcome(FAIL, expected, f"the content is not JSON: {(content or '')[:100]!r}",
                        brief="content is not JSON", request=request, answer=answer)
    if not isinstance(parsed, dict):
        return _outcome(FAIL, expected, f"the content is JSON but not an object: "
                        f"{type(parsed).__name__}", request=request, answer=answer)
    if schema is not None:
        try:
            jsonschema.validate(parsed, schema)
        except jsonschema.ValidationError as exc:
            return _outcome(FAIL, expected, f"does not fit the schema: {exc.message}",
                            brief="content does not fit the schema", request=request,
                            answer=answer)
    return _outcome(PASS, expected, f"a JSON object with {', '.join(sorted(parsed)) or 'no keys'}",
                    request=request, answer=answer)


@case("response_format.json_object", "response_format json_object",
      short="json_object", required=False,
      sends="response_format: {type: json_object}",
      judges="the content parses as a JSON object",
      expected="content that parses as a JSON object")
def json_object(probe: Probe, expected: str) -> Outcome:
    return _json_content_judge(probe, expected, {"type": "json_object"}, None)


@case("response_format.json_schema", "response_format json_schema",
      short="json_schema", required=False,
      sends="response_format: {type: json_schema, json_schema: {name: city, schema: …, "
            "strict: true}}",
      judges="the content parses as JSON and validates against the schema",
      expected="content valid against the given JSON schema")
def json_schema(probe: Probe, expected: str) -> Outcome:
    fmt = {"type": "json_schema",
           "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True}}
    return _json_content_judge(probe, expected, fmt, CITY_SCHEMA)
