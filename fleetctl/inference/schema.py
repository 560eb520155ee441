"""User-given JSON Schemas: the one place fleetctl compiles one.

Every JSON Schema a person or a request gives fleetctl (an eval item's json_schema scorer,
a request's response_format or tool parameters in a shadow pair or a batch comparison) is
compiled here, and nowhere else. Both libraries would otherwise resolve a "$ref" they do
not find in the document by fetching it: over HTTP from the web process, or from a local
file (whose errors then told an attacker what the file holds). So a schema may refer only
to itself ("#/$defs/x", "#anchor", or an "$id" it defines), and may name only a standard
draft in "$schema": `schema_problem` says why not, before anything is compiled (uploads
answer it as a 400), and the libraries are handed a retriever that refuses every URI
without opening anything (`refuse_retrieval`, `LOCAL_ONLY_REGISTRY`), in case a reference
slips past the check. [docs/compare.md](../../docs/compare.md) says how answers use them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, NoReturn
from urllib.parse import urldefrag, urljoin

import jsonschema
import jsonschema_rs
import referencing

from fleetctl.core.jsonl import MAX_DEPTH, too_deep

# Drafts both libraries implement; a "$schema" naming anything else is refused (jsonschema-rs
# would fetch an unknown metaschema, even a look-alike of a standard one).
_DRAFTS = (jsonschema.Draft4Validator, jsonschema.Draft6Validator, jsonschema.Draft7Validator,
           jsonschema.Draft201909Validator, jsonschema.Draft202012Validator)
_REF_KEYWORDS = ("$ref", "$dynamicRef", "$recursiveRef")
# Keywords whose values are instances, not schemas: a "$ref" inside them is only data.
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
# Keywords whose values map names (properties, definitions) to schemas: a property called
# "$ref" or "default" is a name, and its schema is still a schema.
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                            "dependentSchemas", "dependencies"})
LOCAL_ONLY = "only local references (#/…) are allowed"


class SchemaRefused(ValueError):
    """A user-given schema fleetctl will not compile; str() says why (naming the reference
    as the schema wrote it, never anything read from elsewhere)."""


def refuse_retrieval(uri: str) -> NoReturn:
    """The retriever both libraries are given: every URI a schema does not define itself is
    refused, without a request or a file being opened."""
    raise SchemaRefused(f"$ref {_quoted(uri)} points outside the schema; {LOCAL_ONLY}")


# For jsonschema (Python) validators: its own default registry fetches unknown URIs.
# (`retrieve` is an attrs alias of its private field, which mypy's attrs plugin does not see.)
LOCAL_ONLY_REGISTRY: referencing.Registry[Any] = referencing.Registry(
    retrieve=refuse_retrieval)  # type: ignore[call-arg]


def _quoted(text: str, limit: int = 100) -> str:
    return repr(text if len(text) <= limit else text[:limit - 3] + "...")


def schema_problem(schema: Any) -> str | None:
    """Why this user-given schema will not be compiled, or None: it nests deeper than
    jsonl.MAX_DEPTH, refers outside itself, or names a non-standard "$schema". Walked
    without recursion (so any depth is safe to ask about) and without compiling anything."""
    if too_deep(schema):
        return (f"nested deeper than {MAX_DEPTH} levels (arrays and objects inside each "
                f"other), the depth limit")
    refs: list[tuple[str, str]] = []  # (reference, the base URI it is resolved against)
    ids = {""}  # the URIs the document defines: itself (no base), and every "$id" in it
    stack: list[tuple[Any, str]] = [(schema, "")]
    while stack:
        node, base = stack.pop()
        if isinstance(node, list):
            stack.extend((item, base) for item in node)
            continue
        if not isinstance(node, dict):
            continue
        for key in ("$id", "id"):
            if isinstance(node.get(key), str):
                base = urldefrag(urljoin(base, node[key])).url
                ids.add(base)
        meta = node.get("$schema")
        if isinstance(meta, str) and jsonschema.validators.validator_for(
                {"$schema": meta}, default=None) not in _DRAFTS:
            return (f"$schema {_quoted(meta)} is not a JSON Schema draft fleetctl knows "
                    f"(2020-12, 2019-09, 7, 6 or 4); leave it out for 2020-12")
        refs.extend((node[k], base) for k in _REF_KEYWORDS if isinstance(node.get(k), str))
        for key, value in node.items():
            if key in _NAMED_SCHEMAS and isinstance(value, dict):
                stack.extend((inner, base) for inner in value.values())
            elif key not in _DATA_KEYWORDS:
                stack.append((value, base))
    for ref, base in refs:
        if not ref.startswith("#") and urldefrag(urljoin(base, ref)).url not in ids:
            # e.g. "http://…", "file:///…", "other.json", or "a.json" with no "$id" "a.json"
            return f"$ref {_quoted(ref)} points outside the schema; {LOCAL_ONLY}"
    return None


# Validators by their schema's content (canonical JSON), with a fast path on the schema
# object's identity: a run compares thousands of answers against one schema, and building a
# validator (jsonschema's check_schema, then jsonschema-rs's compile: milliseconds) costs far
# more than using it. Keyed by content, not only identity, because an eval run reads each
# item's parameters from its row, a new dict every time (identity alone missed on every row
# and the check took half a worker's CPU). Schemas are treated as immutable once passed in.
# A schema is checked once with `jsonschema` (a broken one raises its SchemaError, as
# evidence data does), and answers are validated with `jsonschema_rs`: the same drafts, about
# 200 times faster on a 512-token JSON answer.
_VALIDATORS: dict[str, Any] = {}
_BY_IDENTITY: dict[int, tuple[Mapping[str, Any], Any]] = {}
# A bundled suite has a few hundred distinct schemas (one per extraction item); a compiled
# validator is a few kilobytes.
_VALIDATORS_MAX = 4096


def schema_validator(schema: Mapping[str, Any]) -> Any:
    """A fast (jsonschema-rs) validator for a user-given `schema`, cached by its content:
    SchemaRefused if `schema_problem` finds one (nothing is compiled), jsonschema's
    SchemaError if it is not a valid schema. No reference is ever fetched."""
    hit = _BY_IDENTITY.get(id(schema))
    if hit is not None and hit[0] is schema:
        return hit[1]
    problem = schema_problem(schema)  # also keeps the deep schema from json.dumps below
    if problem is not None:
        raise SchemaRefused(problem)
    key = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    validator = _VALIDATORS.get(key)
    if validator is None:
        jsonschema.validators.validator_for(schema).check_schema(schema)
        validator = _compiled(schema)
        if len(_VALIDATORS) >= _VALIDATORS_MAX:
            _VALIDATORS.clear()
        _VALIDATORS[key] = validator
    if len(_BY_IDENTITY) >= _VALIDATORS_MAX:
        _BY_IDENTITY.clear()
    _BY_IDENTITY[id(schema)] = (schema, validator)
    return validator


def _compiled(schema: Mapping[str, Any]) -> Any:
    refused: list[str] = []

    def retrieve(uri: str) -> NoReturn:
        refused.append(uri)
        refuse_retrieval(uri)

    try:
        return jsonschema_rs.validator_for(dict(schema), retriever=retrieve)
    except Exception:  # its ValidationError (a ValueError) or ReferencingError (not one)
        if refused:  # the library's message quotes ours; say it in our own words
            raise SchemaRefused(f"$ref {_quoted(refused[0])} points outside the schema; "
                                f"{LOCAL_ONLY}") from None
        raise


def request_schemas(request: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The JSON Schemas an OpenAI request body carries, each with the field holding it:
    response_format's ("response_format.json_schema.schema") and each tool's parameters
    ("tools[0].function.parameters")."""
    found: list[tuple[str, Any]] = []
    fmt = request.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema" \
            and isinstance(fmt.get("json_schema"), dict) and "schema" in fmt["json_schema"]:
        found.append(("response_format.json_schema.schema", fmt["json_schema"]["schema"]))
    tools = request.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(fn, dict) and "parameters" in fn:
            found.append((f"tools[{i}].function.parameters", fn["parameters"]))
    return found


def request_schema_problem(request: Mapping[str, Any]) -> tuple[str, str] | None:
    """(field, why) for the first schema in an OpenAI request body that schema_problem
    refuses, or None: what uploads of requests (batch inputs, eval items) check."""
    for field_name, schema in request_schemas(request):
        problem = schema_problem(schema)
        if problem is not None:
            return field_name, problem
    return None
