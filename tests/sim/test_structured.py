"""The JSON generator behind tool calls and structured outputs: values validate against the
schemas clients send, the same request gives the same JSON, and the text splits into
simulator tokens that join back exactly."""

from __future__ import annotations

import json
import random
from typing import Any, Literal

import jsonschema
import pytest
from pydantic import BaseModel

from fleetctl.sim.structured import ScriptedStream, json_text, pieces, value_for
from fleetctl.sim.textgen import TOKEN_RE, TextKey


class Address(BaseModel):
    street: str
    zip_code: int


class Customer(BaseModel):
    name: str
    vip: bool
    tier: Literal["gold", "silver"]
    addresses: list[Address]
    manager: Customer | None = None
    score: float | None


SCHEMAS: list[tuple[str, dict[str, Any]]] = [
    ("empty", {}),
    ("object-no-properties", {"type": "object"}),
    ("scalars", {"type": "object", "properties": {
        "s": {"type": "string", "minLength": 30, "maxLength": 35},
        "i": {"type": "integer", "minimum": -3, "maximum": 3},
        "m": {"type": "integer", "multipleOf": 5, "minimum": 1, "maximum": 30},
        "n": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
        "b": {"type": "boolean"},
        "z": {"type": "null"},
        "e": {"enum": [1, "two", None]},
        "c": {"const": {"fixed": True}},
    }, "required": ["s", "i", "m", "n", "b", "z", "e", "c"], "additionalProperties": False}),
    ("arrays", {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2, "maxItems": 2},
        "grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "pair": {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}]},
    }, "required": ["tags", "grid", "pair"]}),
    ("union-types", {"type": "object", "properties": {
        "maybe": {"type": ["integer", "null"], "minimum": 10},
        "any": {"anyOf": [{"type": "null"}, {"type": "string", "maxLength": 3}]},
        "one": {"oneOf": [{"type": "boolean"}]},
        "both": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}},
                            "required": ["a"]},
                           {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
    }, "required": ["maybe", "any", "one", "both"]}),
    ("refs", {"type": "object", "properties": {"p": {"$ref": "#/definitions/point"}},
              "required": ["p"], "definitions": {"point": {
                  "type": "object", "properties": {"x": {"type": "number"}},
                  "required": ["x"]}}}),
    ("pydantic-recursive", Customer.model_json_schema()),
    ("map", {"type": "object", "additionalProperties": {"type": "integer"},
             "minProperties": 2}),
]


@pytest.mark.parametrize("schema", [s for _, s in SCHEMAS], ids=[n for n, _ in SCHEMAS])
def test_generated_values_validate_against_the_schema(schema: dict[str, Any]) -> None:
    for seed in range(25):
        value = value_for(schema, random.Random(seed))
        jsonschema.validate(value, schema)


def test_the_same_key_gives_the_same_json_and_another_seed_another() -> None:
    schema = Customer.model_json_schema()
    key = TextKey.of("m", "prompt", None)
    first = json_text(schema, key, "tool:f")
    assert json_text(schema, key, "tool:f") == first
    assert json_text(schema, TextKey.of("m", "prompt", 1), "tool:f") != first
    assert isinstance(json.loads(json_text(None, key, "json_object")), dict)


def test_a_hostile_schema_is_answered_quickly_and_boundedly() -> None:
    schema = {"type": "object", "properties": {
        "many": {"type": "array", "minItems": 10**9, "items": {"type": "string",
                                                              "minLength": 10**9}},
    }, "required": ["many"]}
    assert len(json_text(schema, TextKey.of("m", "p", None), "x")) < 10**7


@pytest.mark.parametrize("text", ['{"a": [1, 2.5, "b c"], "d": null}', "plain words, here.",
                                  '  {"x":1}  '])
def test_pieces_are_simulator_tokens_that_join_back_exactly(text: str) -> None:
    parts = pieces(text)
    assert "".join(parts) == text
    assert len(parts) == len(TOKEN_RE.findall(text))


def test_a_scripted_stream_yields_its_pieces_then_ends() -> None:
    text = '{"city": "Lisbon"}'
    stream = ScriptedStream(text, TextKey.of("m", "p", None), top_logprobs=3)
    tokens = [stream.next() for _ in range(stream.natural_length)]
    assert "".join(t.text for t in tokens) == text
    assert stream.divergence is None
    for token in tokens:
        assert token.top is not None and len(token.top) == 3
        assert token.top[0] == (token.text, token.logprob)
