"""Comparing two answers from OpenAI-compatible endpoints: the one place that does it.

Made for shadow runs (primary vs secondary is the noise floor, primary vs candidate the
signal), eval runs and batch jobs: each builds an `Answer` from each endpoint's response and
calls `compare(a, b, greedy=...)` (no job does yet). Everything here is pure and
deterministic: no I/O, no Django, no clock. [docs/compare.md](../../docs/compare.md)
defines every field.

Tokens. When a response carries logprobs, its tokens are the logprob entries' tokens
(the server's own tokenisation). Otherwise the text is split with `TOKEN_RE`: a run of
word characters, or one other non-space character; whitespace separates and is not a
token. Two answers are compared token by token on the server's tokens only when both
carry them; otherwise both sides are split with `TOKEN_RE`, so the two sequences are
always cut the same way.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rapidfuzz.distance import Levenshtein

from fleetctl.inference.schema import schema_validator

TOKEN_RE = re.compile(r"\w+|[^\w\s]")

# A near-tie: at the first divergent position, the other side's token sits in this side's
# top_logprobs within this many nats of the token this side chose.
NEAR_TIE_NATS = 0.1

# Refusal heuristic: a reply whose first REFUSAL_WINDOW characters contain one of these
# (lower-cased, curly apostrophes straightened) reads as a refusal, as does a chat
# message with a non-empty `refusal` field. Deliberately small: a rate, not a verdict.
REFUSAL_PHRASES: tuple[str, ...] = (
    "i'm sorry, but i can't",
    "i'm sorry, but i cannot",
    "i am sorry, but i cannot",
    "i can't help with",
    "i cannot help with",
    "i can't assist with",
    "i cannot assist with",
    "i can't provide",
    "i cannot provide",
    "i'm unable to",
    "i am unable to",
    "i won't be able to",
    "i cannot comply",
    "i must decline",
    "as an ai language model",
)
REFUSAL_WINDOW = 200


def tokenize(text: str) -> tuple[str, ...]:
    """The fallback tokenisation (`TOKEN_RE`), used when a response has no logprobs."""
    return tuple(TOKEN_RE.findall(text))


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: str  # the raw string the model produced, JSON or not


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None


@dataclass(frozen=True, slots=True)
class Answer:
    """One endpoint's answer to one request (choice 0), successful or not."""

    text: str = ""
    tokens: tuple[str, ...] = ()
    # True when `tokens` are the server's (from logprobs), False when split with TOKEN_RE.
    tokens_from_logprobs: bool = False
    logprobs: tuple[float, ...] | None = None
    # Per token, the alternatives the server listed: token -> logprob.
    top_logprobs: tuple[Mapping[str, float], ...] | None = None
    finish_reason: str | None = None
    status: int = 200
    error_code: str | None = None
    error_message: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    refusal: str | None = None  # a chat message's `refusal` field
    ttft_s: float | None = None
    tpot_s: float | None = None
    usage: Usage | None = None

    @property
    def failed(self) -> bool:
        return (not 200 <= self.status < 300 or self.error_code is not None
                or self.error_message is not None)

    # -- constructors ---------------------------------------------------------------

    @classmethod
    def from_text(cls, text: str, *, finish_reason: str | None = "stop",
                  tool_calls: Iterable[ToolCall] = (), ttft_s: float | None = None,
                  tpot_s: float | None = None) -> Answer:
        """An answer known only by its text (eval references, stored replies)."""
        return cls(text=text, tokens=tokenize(text), finish_reason=finish_reason,
                   tool_calls=tuple(tool_calls), ttft_s=ttft_s, tpot_s=tpot_s)

    @classmethod
    def from_error(cls, status: int, *, code: str | None = None, message: str | None = None,
                   ttft_s: float | None = None) -> Answer:
        """A call that failed: an HTTP status (0 when no response came back: a timeout or
        a refused connection) and the error's code and message when the body gave them."""
        return cls(status=status, error_code=code, error_message=message, ttft_s=ttft_s)

    @classmethod
    def from_body(cls, body: Mapping[str, Any], *, status: int = 200,
                  ttft_s: float | None = None, tpot_s: float | None = None) -> Answer:
        """From a parsed non-streamed chat/completions or completions body. An `error`
        object in the body, or a status of 400 or more, makes an error answer."""
        error = body.get("error")
        if status >= 400 or error is not None:
            return _error_answer(status, error, ttft_s)
        choices = body.get("choices") or []
        choice: Mapping[str, Any] = choices[0] if choices else {}
        message = choice.get("message")
        tool_calls: list[ToolCall] = []
        refusal = None
        if message is not None:  # chat
            text = message.get("content") or ""
            refusal = message.get("refusal") or None
            for call in message.get("tool_calls") or []:
                fn = call.get("function") or {}
                tool_calls.append(ToolCall(fn.get("name") or "", fn.get("arguments") or ""))
        else:  # completions
            text = choice.get("text") or ""
        entries = _logprob_entries(choice.get("logprobs"))
        return cls._build(text, entries, choice.get("finish_reason"), tool_calls, refusal,
                          _usage(body.get("usage")), ttft_s, tpot_s)

    @classmethod
    def from_chunks(cls, chunks: Iterable[Mapping[str, Any]], *, status: int = 200,
                    ttft_s: float | None = None, tpot_s: float | None = None) -> Answer:
        """From the parsed `data:` objects of a stream, in order (without `[DONE]`).
        Tool calls are assembled by their `index`; usage comes from the chunk that has it.
        A chunk with an `error` object (some servers end a failed stream so) makes an
        error answer."""
        text: list[str] = []
        entries: list[tuple[str, float, Mapping[str, float]]] = []
        has_logprobs = False
        calls: dict[int, list[str]] = {}
        finish = None
        refusal: list[str] = []
        usage = None
        for chunk in chunks:
            if chunk.get("error") is not None:
                return _error_answer(status if status >= 400 else 500, chunk["error"], ttft_s)
            if chunk.get("usage"):
                usage = _usage(chunk["usage"])
            for choice in chunk.get("choices") or []:
                if choice.get("index", 0) != 0:
                    continue
                delta = choice.get("delta")
                if delta is not None:  # chat
                    text.append(delta.get("content") or "")
                    if delta.get("refusal"):
                        refusal.append(delta["refusal"])
                    for call in delta.get("tool_calls") or []:
                        slot = calls.setdefault(call.get("index", 0), ["", ""])
                        fn = call.get("function") or {}
                        slot[0] += fn.get("name") or ""
                        slot[1] += fn.get("arguments") or ""
                else:  # completions
                    text.append(choice.get("text") or "")
                got = _logprob_entries(choice.get("logprobs"))
                if got is not None:
                    has_logprobs = True
                    entries.extend(got)
                if choice.get("finish_reason"):
                    finish = choice["finish_reason"]
        tool_calls = [ToolCall(name, args) for _, (name, args) in sorted(calls.items())]
        return cls._build("".join(text), entries if has_logprobs else None, finish,
                          tool_calls, "".join(refusal) or None, usage, ttft_s, tpot_s)

    @classmethod
    def _build(cls, text: str, entries: list[tuple[str, float, Mapping[str, float]]] | None,
               finish: str | None, tool_calls: list[ToolCall], refusal: str | None,
               usage: Usage | None, ttft_s: float | None, tpot_s: float | None) -> Answer:
        if entries:
            return cls(text=text, tokens=tuple(e[0] for e in entries), tokens_from_logprobs=True,
                       logprobs=tuple(e[1] for e in entries),
                       top_logprobs=tuple(e[2] for e in entries), finish_reason=finish,
                       tool_calls=tuple(tool_calls), refusal=refusal, ttft_s=ttft_s,
                       tpot_s=tpot_s, usage=usage)
        return cls(text=text, tokens=tokenize(text), finish_reason=finish,
                   tool_calls=tuple(tool_calls), refusal=refusal, ttft_s=ttft_s,
                   tpot_s=tpot_s, usage=usage)


def _error_answer(status: int, error: Any, ttft_s: float | None) -> Answer:
    code = message = None
    if isinstance(error, Mapping):
        raw = error.get("code") or error.get("type")
        code = None if raw is None else str(raw)
        message = error.get("message")
    elif error is not None:
        message = str(error)
    return Answer.from_error(status if status >= 400 else 500, code=code, message=message,
                             ttft_s=ttft_s)


def _usage(raw: Any) -> Usage | None:
    if not isinstance(raw, Mapping):
        return None
    return Usage(raw.get("prompt_tokens"), raw.get("completion_tokens"), raw.get("total_tokens"))


def _logprob_entries(raw: Any) -> list[tuple[str, float, Mapping[str, float]]] | None:
    """(token, logprob, top) per token from either logprobs shape: chat's
    `{"content": [{token, logprob, top_logprobs: [{token, logprob}]}]}` or completions'
    `{"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob}]}`."""
    if not isinstance(raw, Mapping):
        return None
    content = raw.get("content")
    if content is not None:
        return [(e["token"], float(e["logprob"]),
                 {t["token"]: float(t["logprob"]) for t in e.get("top_logprobs") or []})
                for e in content]
    tokens = raw.get("tokens")
    if tokens is None:
        return None
    lps = raw.get("token_logprobs") or [math.nan] * len(tokens)
    tops = raw.get("top_logprobs") or [None] * len(tokens)
    return [(t, math.nan if lp is None else float(lp),
             {k: float(v) for k, v in (top or {}).items()})
            for t, lp, top in zip(tokens, lps, tops, strict=False)]


# -- the comparison -------------------------------------------------------------------

_MISSING = object()


def _parse_json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return _MISSING


def _usable(schema: Any) -> bool:
    try:
        schema_validator(schema)
    except Exception:  # refused, or not a schema (jsonschema's or jsonschema-rs's error)
        return False
    return True


def _conforms(value: Any, schema: Mapping[str, Any] | None) -> bool:
    if value is _MISSING:
        return False
    if schema is None:
        return True
    return bool(schema_validator(schema).is_valid(value))


def is_refusal(answer: Answer) -> bool:
    if answer.refusal:
        return True
    head = answer.text[:REFUSAL_WINDOW].lower().replace("\u2019", "'")
    return any(phrase in head for phrase in REFUSAL_PHRASES)


def _tool_schemas(tools: Sequence[Mapping[str, Any]] | None) -> dict[str, Mapping[str, Any]]:
    """name -> parameters schema, from a request's `tools` list (OpenAI's shape)."""
    found: dict[str, Mapping[str, Any]] = {}
    for tool in tools or []:
        fn = tool.get("function") or {}
        if fn.get("name"):
            found[fn["name"]] = fn.get("parameters") or {}
    return found


def _tools_valid(calls: tuple[ToolCall, ...], schemas: dict[str, Mapping[str, Any]],
                 tools_given: bool) -> bool | None:
    if not calls:
        return None
    for call in calls:
        args = _parse_json(call.arguments)
        if args is _MISSING:
            return False
        if tools_given and (call.name not in schemas
                            or not _conforms(args, schemas[call.name])):
            return False
    return True


@dataclass(frozen=True, slots=True)
class Comparison:
    """How answer `b` differs from answer `a`. A field is None when it was not computed
    (not applicable, or text-level in sampled mode); docs/compare.md defines each."""

    greedy: bool
    text_compared: bool
    exact_match: bool | None
    first_divergence: int | None
    token_a: str | None
    token_b: str | None
    edit_distance: float | None
    token_edit_distance: float | None
    tokens_a: int
    tokens_b: int
    length_ratio: float | None
    finish_a: str | None
    finish_b: str | None
    finish_mismatch: bool
    errored_a: bool
    errored_b: bool
    error_mismatch: bool
    json_checked: bool
    json_valid_a: bool | None
    json_valid_b: bool | None
    json_equal: bool | None
    tool_calls_valid_a: bool | None
    tool_calls_valid_b: bool | None
    tool_names_equal: bool | None
    tool_args_equal: bool | None
    near_tie: bool | None
    hard_flip: bool | None
    refusal_a: bool
    refusal_b: bool
    ttft_a: float | None
    ttft_b: float | None
    tpot_a: float | None
    tpot_b: float | None
    diverged: bool = field(default=False)

    @property
    def validity_mismatch(self) -> bool:
        return (self.json_valid_a != self.json_valid_b
                or self.tool_calls_valid_a != self.tool_calls_valid_b)

    def metrics(self) -> dict[str, int]:
        """0/1 flags, only for the metrics this pair computed, so that a rate's
        denominator counts only the pairs where it was measured."""
        out: dict[str, int] = {
            "diverged": int(self.diverged),
            "finish_mismatch": int(self.finish_mismatch),
            "error_mismatch": int(self.error_mismatch),
            "errored_a": int(self.errored_a),
            "errored_b": int(self.errored_b),
            "refusal_a": int(self.refusal_a),
            "refusal_b": int(self.refusal_b),
            "refusal_mismatch": int(self.refusal_a != self.refusal_b),
        }
        optional = {
            "exact_match": self.exact_match,
            "json_valid_a": self.json_valid_a,
            "json_valid_b": self.json_valid_b,
            "json_equal": self.json_equal,
            "tool_calls_valid_a": self.tool_calls_valid_a,
            "tool_calls_valid_b": self.tool_calls_valid_b,
            "tool_names_equal": self.tool_names_equal,
            "tool_args_equal": self.tool_args_equal,
            "near_tie": self.near_tie,
            "hard_flip": self.hard_flip,
        }
        out.update({k: int(v) for k, v in optional.items() if v is not None})
        if self.json_checked or self.tool_calls_valid_a is not None \
                or self.tool_calls_valid_b is not None:
            out["validity_mismatch"] = int(self.validity_mismatch)
        return out


def _first_divergence(ta: Sequence[str], tb: Sequence[str]) -> int | None:
    for i, (x, y) in enumerate(zip(ta, tb, strict=False)):
        if x != y:
            return i
    return None if len(ta) == len(tb) else min(len(ta), len(tb))


def _near_tie(a: Answer, b: Answer, at: int, nats: float) -> bool | None:
    """None unless both sides have logprobs at `at`; then True when either side lists
    the other's token within `nats` of its own choice."""
    if (a.top_logprobs is None or b.top_logprobs is None or a.logprobs is None
            or b.logprobs is None or at >= len(a.tokens) or at >= len(b.tokens)):
        return None
    for this, other in ((a, b), (b, a)):
        assert this.top_logprobs is not None and this.logprobs is not None
        alt = this.top_logprobs[at].get(other.tokens[at])
        if alt is not None and abs(this.logprobs[at] - alt) <= nats:
            return True
    return False


def requested_greedy(request: Mapping[str, Any]) -> bool:
    """Temperature 0 said explicitly in an OpenAI request body: only then is the text itself
    comparable (what shadow pairs and batch comparisons both go by)."""
    value = request.get("temperature")
    return not isinstance(value, bool) and isinstance(value, int | float) and value == 0


def requested_form(request: Mapping[str, Any]) -> dict[str, Any]:
    """What an OpenAI request body asked of the answer's form, as `compare`'s keyword
    arguments: JSON (and its schema), tools. A schema fleetctl cannot use (not a schema, or
    refused: it points outside itself) is left out, so the answers are still compared as
    JSON, and a tool with one keeps its name with parameters unchecked."""
    fmt = request.get("response_format")
    fmt = fmt if isinstance(fmt, dict) else {}
    kind = fmt.get("type")
    schema = None
    if kind == "json_schema" and isinstance(fmt.get("json_schema"), dict):
        found = fmt["json_schema"].get("schema")
        schema = found if isinstance(found, dict) and _usable(found) else None
    tools = request.get("tools")
    return {"expect_json": kind in ("json_object", "json_schema"), "schema": schema,
            "tools": _usable_tools(tools) if isinstance(tools, list) else None}


def _usable_tools(tools: list[Any]) -> list[Any]:
    out = []
    for tool in tools:
        fn = tool.get("function") if isinstance(tool, dict) else None
        params = fn.get("parameters") if isinstance(fn, dict) else None
        if isinstance(params, dict) and not _usable(params):
            tool = {**tool, "function": {**fn, "parameters": {}}}  # type: ignore[dict-item]
        out.append(tool)
    return out


def compare(a: Answer, b: Answer, *, greedy: bool, schema: Mapping[str, Any] | None = None,
            expect_json: bool = False, tools: Sequence[Mapping[str, Any]] | None = None,
            near_tie_nats: float = NEAR_TIE_NATS) -> Comparison:
    """Compare `b` against `a` (a is the reference: primary, or the eval's reference).

    greedy: the request ran at temperature 0, so the text itself is comparable. With
    greedy=False only distribution-level fields are computed (length, finish reason,
    validity, refusal, error) and every text-level field is None.
    schema: a JSON Schema the text must conform to (implies expect_json).
    expect_json: the request asked for JSON (response_format json_object).
    tools: the request's `tools` list; tool-call arguments must match their parameters.
    """
    errored_a, errored_b = a.failed, b.failed
    both_ok = not errored_a and not errored_b
    text_compared = greedy and both_ok
    ta, tb = _token_sequences(a, b)
    text = _text_fields(a, b, ta, tb, near_tie_nats) if text_compared else _NO_TEXT_FIELDS
    form = _json_fields(a, b, schema=schema, checked=(expect_json or schema is not None)
                        and both_ok, text_compared=text_compared)
    schemas = _tool_schemas(tools)
    tv_a = None if errored_a else _tools_valid(a.tool_calls, schemas, tools is not None)
    tv_b = None if errored_b else _tools_valid(b.tool_calls, schemas, tools is not None)
    finish_mismatch = both_ok and a.finish_reason != b.finish_reason
    error_mismatch = errored_a != errored_b or (
        errored_a and errored_b
        and (a.status, a.error_code) != (b.status, b.error_code))
    refusal_a, refusal_b = is_refusal(a), is_refusal(b)
    if greedy:
        diverged = (finish_mismatch or error_mismatch or text["exact_match"] is False
                    or text["tool_names_equal"] is False or text["tool_args_equal"] is False)
    else:
        diverged = (finish_mismatch or error_mismatch or refusal_a != refusal_b
                    or form["json_valid_a"] != form["json_valid_b"] or tv_a != tv_b)
    return Comparison(
        greedy=greedy, text_compared=text_compared, **text, tokens_a=len(ta),
        tokens_b=len(tb), length_ratio=_length_ratio(ta, tb), finish_a=a.finish_reason,
        finish_b=b.finish_reason, finish_mismatch=finish_mismatch, errored_a=errored_a,
        errored_b=errored_b, error_mismatch=error_mismatch, **form, tool_calls_valid_a=tv_a,
        tool_calls_valid_b=tv_b, refusal_a=refusal_a, refusal_b=refusal_b, ttft_a=a.ttft_s,
        ttft_b=b.ttft_s, tpot_a=a.tpot_s, tpot_b=b.tpot_s, diverged=diverged,
    )


def _token_sequences(a: Answer, b: Answer) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Both answers cut the same way: the server's tokens when both carry them, else both
    split with TOKEN_RE."""
    if a.tokens_from_logprobs and b.tokens_from_logprobs:
        return a.tokens, b.tokens
    return (tokenize(a.text) if a.tokens_from_logprobs else a.tokens,
            tokenize(b.text) if b.tokens_from_logprobs else b.tokens)


def _length_ratio(ta: Sequence[str], tb: Sequence[str]) -> float | None:
    """b/a in tokens; 1.0 when both are empty, None when only a is."""
    return len(tb) / len(ta) if ta else (None if tb else 1.0)


# The text-level fields of a pair whose text is not compared (sampled, or a side failed).
_NO_TEXT_FIELDS: dict[str, Any] = {
    "exact_match": None, "first_divergence": None, "token_a": None, "token_b": None,
    "edit_distance": None, "token_edit_distance": None, "near_tie": None, "hard_flip": None,
    "tool_names_equal": None, "tool_args_equal": None}


def _text_fields(a: Answer, b: Answer, ta: Sequence[str], tb: Sequence[str],
                 near_tie_nats: float) -> dict[str, Any]:
    """The text-level fields (greedy, both answered), named as Comparison's."""
    out = dict(_NO_TEXT_FIELDS)
    out["exact_match"] = exact = a.text == b.text and a.tool_calls == b.tool_calls
    if not exact:
        first = _first_divergence(ta, tb)
        if first is not None:
            near = _near_tie(a, b, first, near_tie_nats)
            out.update(first_divergence=first,
                       token_a=ta[first] if first < len(ta) else None,
                       token_b=tb[first] if first < len(tb) else None,
                       near_tie=near, hard_flip=None if near is None else not near)
    out["edit_distance"] = Levenshtein.normalized_distance(a.text, b.text)
    out["token_edit_distance"] = Levenshtein.normalized_distance(ta, tb)
    if a.tool_calls or b.tool_calls:
        out["tool_names_equal"] = ([c.name for c in a.tool_calls]
                                   == [c.name for c in b.tool_calls])
        out["tool_args_equal"] = len(a.tool_calls) == len(b.tool_calls) and all(
            _json_equal(x.arguments, y.arguments)
            for x, y in zip(a.tool_calls, b.tool_calls, strict=True))
    return out


def _json_fields(a: Answer, b: Answer, *, schema: Mapping[str, Any] | None, checked: bool,
                 text_compared: bool) -> dict[str, Any]:
    """json_checked, each side's validity (against `schema` when given) and, when the text
    is compared, whether both parse to one value; named as Comparison's."""
    out: dict[str, Any] = {"json_checked": checked, "json_valid_a": None,
                           "json_valid_b": None, "json_equal": None}
    if checked:
        pa, pb = _parse_json(a.text), _parse_json(b.text)
        out["json_valid_a"], out["json_valid_b"] = _conforms(pa, schema), _conforms(pb, schema)
        if text_compared:
            out["json_equal"] = pa is not _MISSING and pb is not _MISSING and pa == pb
    return out


def _json_equal(x: str, y: str) -> bool:
    px, py = _parse_json(x), _parse_json(y)
    if px is _MISSING or py is _MISSING:
        return x == y
    return bool(px == py)
