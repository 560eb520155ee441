"""The scorers that read an answer as structure: JSON validity, JSON Schema conformance and
tool calls. docs/scorers.md describes each."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import jsonschema

from fleetctl.evals.scorers.base import (
    Params,
    Score,
    _bool,
    _fail,
    _json_of,
    _loads,
    _NotJson,
    _take,
    json_same,
)
from fleetctl.inference import schema as schemas
from fleetctl.inference.compare import Answer, ToolCall

# -- JSON validity ----------------------------------------------------------------------


def _json_validate(params: Mapping[str, Any] | None) -> Params:
    params = _take("json", params, ("fences", "equal"))
    return {"fences": _bool("json", params, "fences", True),
            "equal": _bool("json", params, "equal", False)}


def _json_reference(ref: str, params: Params) -> str | None:
    if not params["equal"]:
        return None
    try:
        _loads(ref)
    except _NotJson as exc:
        return f"is not JSON ({exc}); with equal, give the expected JSON value"
    return None


def _json_score(answer: Answer, references: Sequence[str], params: Params) -> Score:
    try:
        value, where = _json_of(answer.text, params["fences"])
    except _NotJson as exc:
        return Score(0.0, f"not valid JSON: {exc}")
    if not params["equal"]:
        return Score(1.0, f"valid JSON ({where})")
    if not references:
        return Score(0.0, "equal is set but the item has no reference")
    for ref in references:
        try:
            if json_same(value, _loads(ref)):
                return Score(1.0, f"valid JSON ({where}) equal to the reference")
        except _NotJson:
            continue
    return Score(0.0, f"valid JSON ({where}) but equal to no reference")


# -- JSON Schema ------------------------------------------------------------------------


def _schema_validate(params: Mapping[str, Any] | None) -> Params:
    params = _take("json_schema", params, ("schema", "fences"))
    schema = params.get("schema")
    if not isinstance(schema, dict):
        raise _fail("json_schema", "schema", "schema is required: a JSON Schema object "
                    "(Draft 2020-12 unless its $schema says otherwise)")
    try:
        # The one compile of a user-given schema (inference/schema.py): nothing outside it
        # is fetched.
        schemas.schema_validator(schema)
    except schemas.SchemaRefused as exc:
        raise _fail("json_schema", "schema", str(exc)) from None
    except jsonschema.SchemaError as exc:
        path = "/".join(str(p) for p in exc.path) or "(root)"
        raise _fail("json_schema", "schema", f"schema is not a valid JSON Schema at {path}: "
                    f"{exc.message}") from None
    except Exception as exc:  # jsonschema_rs's own refusal (an unknown format, say)
        raise _fail("json_schema", "schema", "schema is not a valid JSON Schema: "
                    f"{str(exc).splitlines()[0]}") from None
    return {"schema": schema, "fences": _bool("json_schema", params, "fences", True)}


def _schema_score(answer: Answer, references: Sequence[str], params: Params) -> Score:
    try:
        value, where = _json_of(answer.text, params["fences"])
    except _NotJson as exc:
        return Score(0.0, f"not valid JSON: {exc}")
    try:
        validator = schemas.schema_validator(params["schema"])
    except schemas.SchemaRefused as exc:  # stored before schemas were checked: never fetched
        return Score(0.0, f"the item's schema is refused: {exc}")
    error = next(iter(validator.iter_errors(value)), None)
    if error is None:
        return Score(1.0, f"conforms to the schema ({where})")
    path = "/".join(str(p) for p in error.instance_path) or "(root)"
    return Score(0.0, f"does not conform at {path}: {error.message}"[:300])


# -- tool call --------------------------------------------------------------------------


def _tool_validate(params: Mapping[str, Any] | None) -> Params:
    params = _take("tool_call", params, ("partial",))
    return {"partial": _bool("tool_call", params, "partial", False)}


def _reference_call(ref: str) -> tuple[str, Any]:
    """A reference's (name, arguments): `{"name": ..., "arguments": {...}}`, arguments as
    an object or as the JSON string the API carries. Raises _NotJson."""
    value = _loads(ref)
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        raise _NotJson('give {"name": "...", "arguments": {...}}')
    args = value.get("arguments", {})
    return value["name"], _loads(args) if isinstance(args, str) else args


def _tool_reference(ref: str, params: Params) -> str | None:
    try:
        _reference_call(ref)
    except _NotJson as exc:
        return f"is not a tool call: {exc}"
    return None


def _answer_calls(answer: Answer) -> tuple[list[ToolCall], str]:
    """The answer's tool calls; a model that wrote the call as JSON text instead (some do
    when tools are emulated) is read from its text."""
    if answer.tool_calls:
        return list(answer.tool_calls), "tool_calls"
    try:
        value, _ = _json_of(answer.text, True)
    except _NotJson:
        return [], "text"
    if isinstance(value, dict) and isinstance(value.get("name"), str):
        args = value.get("arguments", {})
        return [ToolCall(value["name"],
                                 args if isinstance(args, str) else json.dumps(args))], "text"
    return [], "text"


def _args_credit(got: Any, want: Any) -> float:
    """Partial credit for arguments: the share of keys (either side's) whose values match."""
    if not isinstance(got, dict) or not isinstance(want, dict):
        return 1.0 if json_same(got, want) else 0.0
    keys = got.keys() | want.keys()
    if not keys:
        return 1.0
    return sum(1 for k in keys if k in got and k in want and json_same(got[k], want[k])) \
        / len(keys)


def _tool_one(answer: Answer, ref: str, params: Params) -> Score:
    try:
        name, want = _reference_call(ref)
    except _NotJson as exc:
        return Score(0.0, f"the reference is not a tool call: {exc}")
    calls, source = _answer_calls(answer)
    if not calls:
        return Score(0.0, "the answer makes no tool call")
    best = Score(0.0, f"no call to {name!r}; called "
                 f"{', '.join(repr(c.name) for c in calls)}", calls[0].name)
    for call in calls:
        if call.name != name:
            continue
        try:
            got = _loads(call.arguments) if call.arguments.strip() else {}
        except _NotJson as exc:
            reason = f"called {name!r} but its arguments are not JSON: {exc}"
            candidate = Score(0.5 if params["partial"] else 0.0, reason, call.name)
        else:
            credit = _args_credit(got, want)
            if json_same(got, want):
                candidate = Score(1.0, f"called {name!r} with the reference's arguments "
                                  f"(from {source})", call.name)
            else:
                value = 0.5 + 0.5 * credit if params["partial"] else 0.0
                candidate = Score(value, f"called {name!r}; {credit:.0%} of the argument keys "
                                  "match", call.name)
        if candidate.value > best.value or (best.value == 0.0 and call.name == name):
            best = candidate
        if best.value >= 1.0:
            break
    return best
