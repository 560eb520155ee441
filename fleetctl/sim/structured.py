"""Structured answers: tool calls and JSON output, generated from a JSON Schema.

A pool that "calls a tool" or "answers in JSON" still generates one simulator token per
scheduler step, like any other answer: the JSON text is computed up front (deterministic for
model, prompt, seed and schema) and `ScriptedStream` hands it to the engine one token at a
time, so `max_tokens`, `stop`, streaming, timing and usage behave as for free text. A
`max_tokens` smaller than the JSON cuts it short with `finish_reason: "length"`, as real
servers do.

`value_for(schema, rng)` produces a value that validates against the schema for the keywords
tool definitions and structured outputs use: `type` (also a list of types), `properties`,
`required`, `additionalProperties`, `items`, `minItems`/`maxItems`, `enum`, `const`,
`minimum`/`maximum`/`exclusiveMinimum`/`exclusiveMaximum`, `multipleOf` (integers),
`minLength`/`maxLength`, `anyOf`/`oneOf`/`allOf` (first alternative / merged), local `$ref`
(`#/$defs/...`, `#/definitions/...`). `pattern` and `format` are not honoured (a string of
words is produced).
"""

from __future__ import annotations

import json
import math
import random
import re
from typing import Any

from .textgen import _WORDS, VOCAB, Divergence, TextKey, Token, stable_hash

# One simulator token per piece, each carrying the whitespace before it, so the pieces
# concatenate back to the exact text and their count is the text's token count.
PIECE_RE = re.compile(r"\s*(?:\w+|[^\w\s])")
MAX_DEPTH = 8
# Bounds that keep a hostile schema (minItems = 10**9, deep recursion) from costing memory:
# past them the value may not validate, but the pool keeps answering.
MAX_ITEMS = 64
MAX_STRING = 4096
SHALLOW_DEPTH = 4  # below this, arrays only get the items they must have
_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
_VOCAB_INDEX = {text: i for i, text in enumerate(VOCAB)}


def pieces(text: str) -> list[str]:
    out = PIECE_RE.findall(text)
    # Trailing whitespace belongs to no token; keep it on the last piece so nothing is lost.
    tail = text[sum(len(p) for p in out):]
    if tail and out:
        out[-1] += tail
    return out


def compact_json(value: Any) -> str:
    return json.dumps(value, separators=(", ", ": "), ensure_ascii=False)


class _Generator:
    def __init__(self, rng: random.Random, root: dict[str, Any]) -> None:
        self.rng = rng
        self.root = root

    def value(self, schema: Any, depth: int = 0) -> Any:
        if not isinstance(schema, dict) or depth > MAX_DEPTH:
            return None if depth > MAX_DEPTH else self.words(1, 3)
        schema = self.resolve(schema)
        if "const" in schema:
            return schema["const"]
        if isinstance(schema.get("enum"), list) and schema["enum"]:
            return schema["enum"][self.rng.randrange(len(schema["enum"]))]
        for key in ("anyOf", "oneOf"):
            options = schema.get(key)
            if isinstance(options, list) and options:
                # Prefer an alternative that is not null (a real model fills the field in),
                # except deep down, where null ends a recursive schema.
                usable = [o for o in options if not (isinstance(o, dict)
                                                     and self.resolve(o).get("type") == "null")]
                if depth >= SHALLOW_DEPTH and len(usable) < len(options):
                    return None
                return self.value((usable or options)[0], depth + 1)
        if isinstance(schema.get("allOf"), list):
            merged: dict[str, Any] = {}
            for part in schema["allOf"]:
                if isinstance(part, dict):
                    part = self.resolve(part)
                    props = {**merged.get("properties", {}), **part.get("properties", {})}
                    required = [*merged.get("required", []), *part.get("required", [])]
                    merged.update(part)
                    merged["properties"], merged["required"] = props, required
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            return self.value({**merged, **rest}, depth + 1)
        kind = self.kind(schema)
        if kind == "object":
            return self.object(schema, depth)
        if kind == "array":
            return self.array(schema, depth)
        if kind == "integer":
            return self.integer(schema)
        if kind == "number":
            return self.number(schema)
        if kind == "boolean":
            return self.rng.random() < 0.5
        if kind == "null":
            return None
        return self.string(schema)

    def resolve(self, schema: dict[str, Any]) -> dict[str, Any]:
        seen = 0
        while isinstance(schema.get("$ref"), str) and seen < MAX_DEPTH:
            ref = schema["$ref"]
            target: Any = self.root
            if not ref.startswith("#"):
                return {}
            for part in ref[1:].split("/"):
                if part:
                    target = target.get(part) if isinstance(target, dict) else None
            if not isinstance(target, dict):
                return {}
            schema = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
            seen += 1
        return schema

    @staticmethod
    def kind(schema: dict[str, Any]) -> str:
        declared = schema.get("type")
        if isinstance(declared, list):
            real = [t for t in declared if t != "null" and t in _TYPES]
            declared = real[0] if real else ("null" if "null" in declared else None)
        if declared in _TYPES:
            return str(declared)
        if "properties" in schema or "additionalProperties" in schema:
            return "object"
        if "items" in schema:
            return "array"
        if "minimum" in schema or "maximum" in schema:
            return "number"
        return "string"

    def object(self, schema: dict[str, Any], depth: int) -> dict[str, Any]:
        props = schema.get("properties")
        required = schema.get("required")
        must = {r for r in required if isinstance(r, str)} if isinstance(required, list) else set()
        out: dict[str, Any] = {}
        if isinstance(props, dict):
            for name, sub in props.items():
                # Every property near the top; deep down only the required ones.
                if depth < SHALLOW_DEPTH or name in must:
                    out[str(name)] = self.value(sub, depth + 1)
        if isinstance(required, list):
            extra = schema.get("additionalProperties")
            for name in required:
                if isinstance(name, str) and name not in out:
                    out[name] = self.value(extra if isinstance(extra, dict) else {}, depth + 1)
        if not out and isinstance(schema.get("minProperties"), int) and schema["minProperties"]:
            extra = schema.get("additionalProperties")
            for i in range(min(schema["minProperties"], MAX_ITEMS)):
                out[f"key{i}"] = self.value(extra if isinstance(extra, dict) else {}, depth + 1)
        return out

    def array(self, schema: dict[str, Any], depth: int) -> list[Any]:
        low = min(_int(schema.get("minItems"), 0), MAX_ITEMS)
        high = _int(schema.get("maxItems"), max(low, 3))
        wanted = 1 + self.rng.randrange(3) if depth < SHALLOW_DEPTH else 0
        count = min(high, max(low, wanted))
        items = schema.get("items")
        if isinstance(schema.get("prefixItems"), list):
            prefix = schema["prefixItems"]
            return [self.value(prefix[i] if i < len(prefix) else items or {}, depth + 1)
                    for i in range(max(count, len(prefix)))]
        return [self.value(items if isinstance(items, dict) else {}, depth + 1)
                for _ in range(count)]

    def _bounds(self, schema: dict[str, Any], integer: bool) -> tuple[float, float]:
        low, high = -1e9, 1e9
        if _is_num(schema.get("minimum")):
            low = float(schema["minimum"])
        if _is_num(schema.get("exclusiveMinimum")):
            step = 1 if integer else 1e-6 * max(1.0, abs(schema["exclusiveMinimum"]))
            low = max(low, float(schema["exclusiveMinimum"]) + step)
        if _is_num(schema.get("maximum")):
            high = float(schema["maximum"])
        if _is_num(schema.get("exclusiveMaximum")):
            step = 1 if integer else 1e-6 * max(1.0, abs(schema["exclusiveMaximum"]))
            high = min(high, float(schema["exclusiveMaximum"]) - step)
        if low == -1e9 and high == 1e9:
            low, high = 0.0, 100.0
        elif low == -1e9:
            low = high - 100.0
        elif high == 1e9:
            high = low + 100.0
        return low, high

    def integer(self, schema: dict[str, Any]) -> int:
        low, high = self._bounds(schema, integer=True)
        lo, hi = math.ceil(low), math.floor(high)
        multiple = schema.get("multipleOf")
        if isinstance(multiple, int) and not isinstance(multiple, bool) and multiple > 0:
            first, last = math.ceil(lo / multiple), math.floor(hi / multiple)
            if first <= last:
                return multiple * self.rng.randint(first, last)
        return self.rng.randint(lo, hi) if lo <= hi else lo

    def number(self, schema: dict[str, Any]) -> float | int:
        multiple = schema.get("multipleOf")
        if isinstance(multiple, int) and not isinstance(multiple, bool):
            return self.integer(schema)
        low, high = self._bounds(schema, integer=False)
        value = round(low + (high - low) * self.rng.random(), 2)
        return min(max(value, low), high)

    def string(self, schema: dict[str, Any]) -> str:
        low = min(_int(schema.get("minLength"), 0), MAX_STRING)
        high = _int(schema.get("maxLength"), max(low, 40))
        text = self.words(1, 4)
        while len(text) < low:
            text += " " + self.words(1, 3)
        return text[:high] if high >= low else text

    def words(self, low: int, high: int) -> str:
        count = self.rng.randint(low, high)
        return " ".join(_WORDS[self.rng.randrange(len(_WORDS))] for _ in range(count))


def _is_num(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else default


def value_for(schema: dict[str, Any], rng: random.Random) -> Any:
    """A value that validates against `schema` (see the module docstring for keywords)."""
    return _Generator(rng, schema).value(schema)


JSON_OBJECT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 20}},
    "required": ["answer"],
}


class SchemaError(ValueError):
    """No value can be produced for this schema (e.g. infinite bounds)."""


def json_text(schema: dict[str, Any] | None, key: TextKey, salt: str) -> str:
    """The JSON answer for (model, prompt, seed) and a schema: a JSON object for
    `json_object` (schema None), a schema-valid value for `json_schema` or tool arguments."""
    rng = random.Random(stable_hash("json", salt, key))
    try:
        return compact_json(value_for(JSON_OBJECT_SCHEMA if schema is None else schema, rng))
    except (ArithmeticError, ValueError, TypeError, RecursionError) as exc:
        raise SchemaError(str(exc) or type(exc).__name__) from exc


def broken_json(text: str, u: float) -> str:
    """`text` (a JSON answer) made invalid the way a regressed server breaks it: cut short
    after 40..90 % of its tokens (`u` in [0, 1) picks where), so an object or array misses
    its closing bracket. A value no cut can break (a short number, `true`) gets a stray
    comma instead. The caller still ends it with finish_reason "stop": that is the bug."""
    parts = pieces(text)
    if len(parts) >= 2:
        keep = max(1, min(len(parts) - 1, int(len(parts) * (0.4 + 0.5 * u))))
        cut = "".join(parts[:keep]).rstrip()
        try:
            json.loads(cut)
        except ValueError:
            return cut
    return text.rstrip() + ","

class ScriptedStream:
    """A TokenStream look-alike that yields a fixed text one simulator token at a time and
    ends naturally after the last piece. Never diverges: every pool gives the same JSON."""

    divergence: Divergence | None = None
    flipped_at: int | None = None  # replica noise flips free text only

    def __init__(self, text: str, key: TextKey, top_logprobs: int | None) -> None:
        self.pieces = pieces(text) or [" "]
        self.natural_length = len(self.pieces)
        self.position = 0
        self._rng = random.Random(stable_hash("scripted", key, text))
        self._top_logprobs = top_logprobs

    def next(self) -> Token:
        index = min(self.position, len(self.pieces) - 1)
        self.position += 1
        text = self.pieces[index] if self.position <= len(self.pieces) else " "
        bits = self._rng.getrandbits(64)
        p_top = 0.90 + 0.099 * ((bits & 0xFF) / 255.0)
        logprob = math.log(p_top)
        top = None
        if self._top_logprobs is not None:
            top = [(text, logprob)]
            share, used = (1.0 - p_top) / 2, {text}
            while len(top) < self._top_logprobs:
                alt = VOCAB[self._rng.randrange(len(VOCAB))]
                if alt in used:
                    continue
                used.add(alt)
                top.append((alt, math.log(share)))
                share /= 2
        vocab_index = _VOCAB_INDEX.get(text)
        if vocab_index is None:  # JSON punctuation and names outside the vocabulary
            return Token(vocab_index=0, text=text, logprob=logprob, top=top)
        return Token(vocab_index=vocab_index, text=VOCAB[vocab_index], logprob=logprob, top=top)
