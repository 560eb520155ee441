"""A user-given JSON Schema is compiled in one place (inference/schema.py) and never reaches
outside itself: a "$ref" to a URL or a file, or a "$schema" that is not a standard draft,
is refused before anything is compiled, and the retrievers both libraries are handed
refuse every URI without opening it. A real HTTP server records every request, to prove
that none is sent; a real file shows that its existence and content change no message.
Schemas deeper than the one depth limit are refused too, without recursion."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import jsonschema
import jsonschema_rs
import pytest

from fleetctl.core.jsonl import MAX_DEPTH
from fleetctl.evals import scorers
from fleetctl.inference import compare
from fleetctl.inference import schema as schemas
from fleetctl.inference.compare import Answer, requested_form
from fleetctl.inference.schema import (
    LOCAL_ONLY_REGISTRY,
    SchemaRefused,
    refuse_retrieval,
    schema_problem,
    schema_validator,
)
from tests.core.hostile import nested_schema, recording_server

OUTSIDE = "points outside the schema; only local references (#/…) are allowed"


def remote_forms(url: str) -> list[dict[str, Any]]:
    """Every way the review and the drafts reach outside a schema, aimed at `url`."""
    return [
        {"$ref": f"{url}/schema.json"},
        {"type": "object", "properties": {"a": {"$ref": f"{url}/a.json#/x"}}},
        {"$id": f"{url}/root.json", "$ref": "other.json"},  # relative to a remote base
        {"properties": {"default": {"$ref": f"{url}/named-default.json"}}},
        {"$defs": {"x": {"$dynamicRef": f"{url}/dyn.json#meta"}}, "$ref": "#/$defs/x"},
        {"$schema": "https://json-schema.org/draft/2019-09/schema",
         "$recursiveRef": f"{url}/recursive.json"},
        {"$schema": f"{url}/metaschema.json", "type": "integer"},
        {"anyOf": [{"type": "string"}, {"$ref": f"{url}/any.json"}]},
    ]


# --- what is refused, and what is not --------------------------------------------------------

@pytest.mark.parametrize("schema", [
    {"$defs": {"n": {"type": "integer"}}, "type": "array", "items": {"$ref": "#/$defs/n"}},
    {"$defs": {"n": {"$anchor": "num", "type": "integer"}}, "$ref": "#num"},
    {"type": "object", "properties": {"child": {"$ref": "#"}}},
    {"$id": "https://example.com/root.json", "$defs": {"a": {"$id": "a.json"}},
     "$ref": "a.json"},  # an "$id" the document defines itself
    {"$defs": {"a": {"$id": "a.json", "type": "integer"}}, "$ref": "a.json"},
    {"$dynamicAnchor": "meta", "items": {"$dynamicRef": "#meta"}},
    {"$schema": "http://json-schema.org/draft-07/schema#", "definitions": {"a": {}},
     "$ref": "#/definitions/a"},
    {"properties": {"$ref": {"type": "string"}, "$id": {"type": "string"}}},  # names only
    {"const": {"$ref": "http://127.0.0.1:1/data"}, "examples": [{"$ref": "file:///x"}]},
])
def test_a_schema_may_refer_to_itself(schema: dict[str, Any]) -> None:
    assert schema_problem(schema) is None
    schema_validator(schema)


def test_a_schema_that_points_outside_is_refused_and_nothing_is_fetched() -> None:
    with recording_server() as server:
        for schema in remote_forms(server.url):
            with pytest.raises(SchemaRefused) as refused:
                schema_validator(schema)
            assert server.url in str(refused.value) or "other.json" in str(refused.value)
        assert server.hits == []


def test_the_libraries_default_resolvers_would_have_fetched_it() -> None:
    """The control: the recording server does see a request when one is sent."""
    with recording_server() as server:
        jsonschema_rs.validator_for({"$ref": f"{server.url}/schema.json"})
        assert server.hits == ["/schema.json"]


def test_the_retrievers_refuse_what_the_check_let_through_without_a_request() -> None:
    with recording_server() as server:
        schema = {"properties": {"a": {"$ref": f"{server.url}/a.json"}}}
        with pytest.raises(SchemaRefused, match=re.escape(OUTSIDE)):
            schemas._compiled(schema)  # the compile step alone, past schema_problem
        with pytest.raises(Exception, match=r"a\.json"):
            jsonschema_rs.validator_for(schema, retriever=refuse_retrieval)
        with pytest.raises(Exception, match=r"Unretrievable|a\.json"):
            jsonschema.Draft202012Validator(schema, registry=LOCAL_ONLY_REGISTRY).is_valid(
                {"a": 1})
        assert server.hits == []


def test_a_file_reference_says_the_same_whether_the_file_exists_or_not(tmp_path: Path) -> None:
    secret = tmp_path / "demo-password"
    secret.write_text("7 correct horse\n")  # starts with a digit, as the review's did
    schema = {"$ref": secret.as_uri()}

    def messages() -> list[str]:
        out = []
        for build in (schema_validator, schemas._compiled):
            with pytest.raises(SchemaRefused) as refused:
                build(schema)
            out.append(str(refused.value))
        return out

    present = messages()
    secret.unlink()
    absent = messages()
    assert present == absent == [f"$ref {secret.as_uri()!r} {OUTSIDE}"] * 2
    assert not any(word in present[0] for word in ("correct", "line 1", "No such file"))


def test_a_metaschema_that_is_not_a_standard_draft_is_refused() -> None:
    for meta in ("https://json-schema.org/draft-07/schema#",  # a look-alike, fetched
                 "http://json-schema.org/draft-03/schema#"):  # jsonschema-rs has no draft 3
        problem = schema_problem({"$schema": meta})
        assert problem is not None and "is not a JSON Schema draft fleetctl knows" in problem
    assert schema_problem({"$schema": "https://json-schema.org/draft/2020-12/schema"}) is None


def test_a_schema_nested_deeper_than_the_limit_is_refused_without_recursion() -> None:
    schema_validator(nested_schema(MAX_DEPTH))
    deep: dict[str, Any] = {"type": "integer"}
    for _ in range(5000):
        deep = {"type": "array", "items": deep}
    for schema in (nested_schema(MAX_DEPTH + 2), deep):
        with pytest.raises(SchemaRefused, match=f"nested deeper than {MAX_DEPTH} levels"):
            schema_validator(schema)


# --- where schemas are used -------------------------------------------------------------------

def test_a_comparison_leaves_out_a_schema_that_points_outside_and_fetches_nothing() -> None:
    with recording_server() as server:
        body = {"model": "m", "temperature": 0,
                "response_format": {"type": "json_schema", "json_schema": {
                    "name": "answer", "schema": {"$ref": f"{server.url}/answer.json"}}},
                "tools": [{"type": "function", "function": {
                    "name": "lookup", "parameters": {"$ref": f"{server.url}/tool.json"}}}]}
        form = requested_form(body)
        assert form["expect_json"] and form["schema"] is None
        assert form["tools"][0]["function"] == {"name": "lookup", "parameters": {}}
        result = compare.compare(Answer(text='{"a": 1}'), Answer(text="not json"),
                                 greedy=True, **form)
        assert result.json_valid_a is True and result.json_valid_b is False
        assert server.hits == []


def test_an_eval_item_refers_only_to_itself_at_upload_and_when_scored() -> None:
    with recording_server() as server:
        schema = {"type": "object", "properties": {"n": {"$ref": f"{server.url}/n.json"}}}
        with pytest.raises(scorers.ScorerParamsError) as refused:
            scorers.validate("json_schema", {"schema": schema})
        assert refused.value.fields == {"params.schema": [
            f"$ref '{server.url}/n.json' {OUTSIDE}"]}
        # An item stored before schemas were checked scores 0 and says why, fetching nothing.
        score = scorers.score("json_schema", '{"n": 1}', [], {"schema": schema, "fences": True})
        assert score.value == 0.0 and score.reason == (
            f"the item's schema is refused: $ref '{server.url}/n.json' {OUTSIDE}")
        assert server.hits == []
