"""Scoring one answer against an eval item's references: the registry every eval run uses.

An eval item names a scorer and its parameters; a run scores each pool's answer with
`score(name, answer, references, params)`. Two promises shape this module:

- Parameters are checked once, when a suite is uploaded: `validate(name, params)` returns
  the parameters with every default filled in (so a stored suite says exactly how it is
  scored) or raises `ScorerParamsError` naming the parameter and what to give. Regexes are
  compiled and JSON Schemas checked there, so a broken one is a 400 on upload, not a run of
  zeros.
- Scoring never raises on any answer. A run scores thousands of answers from models that
  can say anything; an answer a scorer cannot read (an error, no number, two letters, a
  regex that would backtrack for ever) scores 0 with the reason, and the run goes on.

Everything here is pure and deterministic: no I/O, no Django, no clock (the regex scorer's
timeout is the `regex` package's own, counted inside the match). `score()` takes the
parameters as `validate()` returned them. docs/scorers.md describes each scorer.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import jsonschema
import regex

from fleetctl.core import compare
from fleetctl.core.compare import Answer
from fleetctl.core.errors import DomainError

Params = dict[str, Any]

# How much of an answer or reference a reason quotes.
SHOW_CHARS = 60
# The regex scorer's default and largest match timeout, in seconds.
REGEX_TIMEOUT_S = 0.1
REGEX_TIMEOUT_MAX_S = 5.0


class ScorerParamsError(DomainError):
    """A suite names an unknown scorer or gives it parameters it cannot use (answered 400)."""

    code = "invalid_scorer_params"


@dataclass(frozen=True, slots=True)
class Score:
    """One answer's score: `value` in [0, 1] (most scorers give 0 or 1), why, and what the
    scorer read from the answer (the number, the letter, the regex group) when it read one,
    so that an item diff can show it."""

    value: float
    reason: str
    extracted: str | None = None


ScoreFn = Callable[[Answer, Sequence[str], Params], Score]


@dataclass(frozen=True, slots=True)
class Scorer:
    name: str
    summary: str
    validate: Callable[[Mapping[str, Any] | None], Params]
    score: ScoreFn
    # False for scorers that judge the answer alone (JSON validity, JSON Schema).
    needs_reference: bool = True
    # Why a reference can never be matched (no number in it, not a tool call), or None:
    # checked at upload by `validate_references`, so a suite cannot hold an item that
    # scores 0 whatever the model says.
    check_reference: Callable[[str, Params], str | None] | None = None


# -- parameters -----------------------------------------------------------------------


def _fail(scorer: str, key: str, message: str) -> ScorerParamsError:
    return ScorerParamsError(f"scorer {scorer!r}: {message}",
                             fields={f"params.{key}": [message]})


def _take(scorer: str, params: Mapping[str, Any] | None, known: Sequence[str]) -> Params:
    """The params as a dict, refusing keys the scorer does not know (a typo such as
    `abs_tolerance` would otherwise silently score with the default)."""
    if params is None:
        return {}
    if not isinstance(params, Mapping):
        raise ScorerParamsError(
            f"scorer {scorer!r}: params must be an object (got {type(params).__name__})",
            fields={"params": ["must be an object"]})
    for key in params:
        if key not in known:
            listed = ", ".join(known) or "none"
            raise _fail(scorer, str(key), f"unknown parameter {key!r}; known: {listed}")
    return dict(params)


def _bool(scorer: str, params: Params, key: str, default: bool) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise _fail(scorer, key, f"{key} must be true or false (got {value!r})")
    return value


def _nonneg(scorer: str, params: Params, key: str, default: float,
            most: float = math.inf) -> float:
    value = params.get(key, default)
    if (isinstance(value, bool) or not isinstance(value, int | float)
            or not math.isfinite(value) or not 0 <= value <= most):
        bound = "" if most == math.inf else f" and at most {most:g}"
        raise _fail(scorer, key, f"{key} must be a number at least 0{bound} (got {value!r})")
    return float(value)


def _one_of(scorer: str, params: Params, key: str, options: Sequence[str], default: str) -> str:
    value = params.get(key, default)
    if value not in options:
        raise _fail(scorer, key, f"{key} must be one of {', '.join(options)} (got {value!r})")
    return str(value)


# -- helpers shared by scorers ----------------------------------------------------------


def _show(text: str) -> str:
    """A value quoted in a reason, cut to SHOW_CHARS."""
    return repr(text if len(text) <= SHOW_CHARS else text[:SHOW_CHARS] + "…")


def _best(per_reference: Callable[[Answer, str, Params], Score]) -> ScoreFn:
    """A scorer over several references: the best score over them (an item with several
    correct answers is right when the answer matches any one)."""

    def score(answer: Answer, references: Sequence[str], params: Params) -> Score:
        if not references:
            return Score(0.0, "the item has no reference to compare with")
        best: Score | None = None
        for ref in references:
            got = per_reference(answer, ref, params)
            if best is None or got.value > best.value:
                best = got
            if best.value >= 1.0:
                break
        assert best is not None
        return best

    return score


_WS_RE = re.compile(r"\s+")
_ARTICLES_RE = re.compile(r"\b(?:a|an|the)\b")


def normalise(text: str, *, unicode: bool = True, case: bool = True, punctuation: bool = True,
              whitespace: bool = True, articles: bool = False) -> str:
    """NFKC (full-width letters, ligatures, non-breaking spaces become their plain forms),
    case-folded, punctuation (every Unicode P* character) dropped, whitespace runs made one
    space and the ends stripped; `articles` also drops English a/an/the (SQuAD's habit)."""
    if unicode:
        text = unicodedata.normalize("NFKC", text)
    if case:
        text = text.casefold()
    if punctuation:
        text = "".join(ch for ch in text if not unicodedata.category(ch).startswith("P"))
    if articles:
        text = _ARTICLES_RE.sub(" ", text)
    if whitespace:
        text = _WS_RE.sub(" ", text).strip()
    return text


_NORMALISE_KEYS = ("unicode", "case", "punctuation", "whitespace", "articles")
_NORMALISE_DEFAULTS = {"unicode": True, "case": True, "punctuation": True, "whitespace": True,
                       "articles": False}


def _normalise_params(scorer: str, params: Params) -> Params:
    return {k: _bool(scorer, params, k, d) for k, d in _NORMALISE_DEFAULTS.items()}


def _normalise_with(text: str, params: Params) -> str:
    return normalise(text, **{k: params[k] for k in _NORMALISE_KEYS})


class _NotJson(Exception):
    pass


def _reject_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not JSON")


def _loads(text: str) -> Any:
    """Strict JSON (NaN and Infinity refused, as RFC 8259 does); raises _NotJson with why.
    Unlike compare's lenient parse, it also survives nesting deep enough to exhaust the
    parser's recursion, which a model can emit."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except _NotJson:
        raise
    except ValueError as exc:
        raise _NotJson(str(exc)) from None
    except RecursionError:
        raise _NotJson("nested too deeply") from None


_FENCE_RE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\r?\n(.*?)\r?\n?[ \t]*```", re.DOTALL)


def _json_of(text: str, fences: bool) -> tuple[Any, str]:
    """The answer's JSON value and where it was found: the whole answer, or (with
    `fences`) the first ```json (or bare ```) fenced block when the whole does not parse.
    Raises _NotJson."""
    try:
        return _loads(text), "the answer"
    except _NotJson as whole:
        if fences:
            found = _FENCE_RE.search(text)
            if found is not None:
                return _loads(found.group(1)), "a ``` fence"
        raise whole from None


def json_same(x: Any, y: Any) -> bool:
    """Equal as JSON values: object key order ignored, 1 == 1.0, but true is not 1
    (Python's `True == 1` would let `{"on": 1}` match `{"on": true}`)."""
    if isinstance(x, bool) or isinstance(y, bool):
        return isinstance(x, bool) and isinstance(y, bool) and x == y
    if isinstance(x, int | float) and isinstance(y, int | float):
        return x == y
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(json_same(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(json_same(a, b) for a, b in zip(x, y, strict=True))
    return type(x) is type(y) and bool(x == y)


# -- exact ------------------------------------------------------------------------------


def _exact_validate(params: Mapping[str, Any] | None) -> Params:
    params = _take("exact", params, ("strip",))
    return {"strip": _bool("exact", params, "strip", True)}


def _exact_one(answer: Answer, ref: str, params: Params) -> Score:
    text = answer.text.strip() if params["strip"] else answer.text
    want = ref.strip() if params["strip"] else ref
    if text == want:
        return Score(1.0, "equals the reference", text)
    return Score(0.0, f"{_show(text)} differs from {_show(want)}", text)


# -- normalised -------------------------------------------------------------------------


def _normalised_validate(params: Mapping[str, Any] | None) -> Params:
    return _normalise_params("normalised", _take("normalised", params, _NORMALISE_KEYS))


def _normalised_one(answer: Answer, ref: str, params: Params) -> Score:
    text, want = _normalise_with(answer.text, params), _normalise_with(ref, params)
    if text == want:
        return Score(1.0, "equals the reference once normalised", text)
    return Score(0.0, f"normalised {_show(text)} differs from {_show(want)}", text)


# -- regex extraction -------------------------------------------------------------------

_REGEX_FLAGS = {"i": regex.IGNORECASE, "m": regex.MULTILINE, "s": regex.DOTALL}


@lru_cache(maxsize=512)
def _compiled(pattern: str, flags: str) -> Any:
    value = 0
    for f in flags:
        value |= _REGEX_FLAGS[f]
    return regex.compile(pattern, value)


def _regex_validate(params: Mapping[str, Any] | None) -> Params:
    keys = ("pattern", "flags", "occurrence", "timeout_s", "compare", *_NORMALISE_KEYS)
    params = _take("regex", params, keys)
    pattern = params.get("pattern")
    if not isinstance(pattern, str) or not pattern:
        raise _fail("regex", "pattern", "pattern is required: a regular expression with "
                    "one capturing group, e.g. \"answer is (\\\\w+)\"")
    flags = params.get("flags", "")
    if not isinstance(flags, str) or any(f not in _REGEX_FLAGS for f in flags):
        raise _fail("regex", "flags", f"flags must be a string of i, m and s (got {flags!r})")
    flags = "".join(sorted(set(flags)))
    try:
        compiled = _compiled(pattern, flags)
    except (regex.error, ValueError, OverflowError) as exc:
        raise _fail("regex", "pattern", f"pattern {_show(pattern)} does not compile: {exc}; "
                    "give a regular expression with one capturing group") from None
    if compiled.groups != 1:
        raise _fail("regex", "pattern", f"pattern {_show(pattern)} has {compiled.groups} "
                    "capturing groups; give exactly one (use (?:...) for the others)")
    out: Params = {
        "pattern": pattern, "flags": flags,
        "occurrence": _one_of("regex", params, "occurrence", ("first", "last"), "first"),
        "timeout_s": _nonneg("regex", params, "timeout_s", REGEX_TIMEOUT_S,
                             REGEX_TIMEOUT_MAX_S),
        "compare": _one_of("regex", params, "compare", ("exact", "normalised"), "normalised"),
    }
    if out["timeout_s"] == 0:
        raise _fail("regex", "timeout_s", "timeout_s must be more than 0")
    out.update(_normalise_params("regex", params))
    return out


def _regex_score(answer: Answer, references: Sequence[str], params: Params) -> Score:
    compiled = _compiled(params["pattern"], params["flags"])
    try:
        if params["occurrence"] == "first":
            found = compiled.search(answer.text, timeout=params["timeout_s"])
        else:
            found = None
            for match in compiled.finditer(answer.text, timeout=params["timeout_s"]):
                found = match
    except TimeoutError:
        return Score(0.0, f"the pattern timed out after {params['timeout_s']:g} s on this "
                     "answer (catastrophic backtracking?)")
    if found is None or found.group(1) is None:
        return Score(0.0, "the pattern does not match the answer")
    got = found.group(1)
    return _best(_extracted_vs_reference)(Answer(text=got), references, params)


def _extracted_vs_reference(extracted: Answer, ref: str, params: Params) -> Score:
    got = extracted.text
    if params["compare"] == "exact":
        ok = got == ref
    else:
        ok = _normalise_with(got, params) == _normalise_with(ref, params)
    if ok:
        return Score(1.0, "the extracted text matches the reference", got)
    return Score(0.0, f"extracted {_show(got)}, reference {_show(ref)}", got)


# -- numeric ----------------------------------------------------------------------------

# A number as people and models write it: a sign (ASCII or U+2212), an optional currency
# sign, digits with comma thousands separators (1,234,567) or without, a decimal part,
# an exponent, a percent sign. Not inside a word ("v2", "x86") nor after a decimal point;
# a minus directly after a digit ("3-4") is a range dash, not a sign.
_NUMBER_RE = re.compile(r"""
    (?<![\w.])
    (?P<sign>[-+\u2212])?
    [$€£¥]?
    (?P<sign2>[-+\u2212])?
    (?:
        (?P<int>[0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?P<frac>\.[0-9]+)?
      | (?P<bare>\.[0-9]+)
    )
    (?P<exp>[eE][-+]?[0-9]+)?
    (?P<pct>\s?%)?
""", re.VERBOSE)


def _numbers(text: str) -> list[tuple[float, str, bool]]:
    """(value, as written, had a percent sign) for each number, in order. NFKC first, so
    full-width digits and the like read as ASCII ones."""
    text = unicodedata.normalize("NFKC", text)
    out = []
    for m in _NUMBER_RE.finditer(text):
        digits = (m["int"] or "").replace(",", "") + (m["frac"] or m["bare"] or "")
        try:
            value = float(digits + (m["exp"] or ""))
        except (ValueError, OverflowError):
            continue
        if (m["sign"] or m["sign2"] or "+") in "-\u2212":
            value = -value
        out.append((value, m.group(0).strip(), m["pct"] is not None))
    return out


def _numeric_validate(params: Mapping[str, Any] | None) -> Params:
    params = _take("numeric", params, ("abs_tol", "rel_tol", "pick", "percent_as_fraction"))
    return {
        "abs_tol": _nonneg("numeric", params, "abs_tol", 0.0),
        "rel_tol": _nonneg("numeric", params, "rel_tol", 0.0),
        "pick": _one_of("numeric", params, "pick", ("last", "first"), "last"),
        "percent_as_fraction": _bool("numeric", params, "percent_as_fraction", False),
    }


def _fmt(value: float) -> str:
    return format(value, ".12g")


def _numeric_reference(ref: str, params: Params) -> str | None:
    return None if _numbers(ref) else 'has no number; give the expected number, e.g. "42"'


def _numeric_one(answer: Answer, ref: str, params: Params) -> Score:
    found = _numbers(answer.text)
    if not found:
        return Score(0.0, "no number in the answer")
    wanted = _numbers(ref)
    if not wanted:
        return Score(0.0, f"the reference {_show(ref)} has no number")
    pick = -1 if params["pick"] == "last" else 0
    (got, written, pct), (want, _, want_pct) = found[pick], wanted[pick]
    if params["percent_as_fraction"]:
        got, want = (got / 100 if pct else got), (want / 100 if want_pct else want)
    if math.isclose(got, want, rel_tol=params["rel_tol"], abs_tol=params["abs_tol"]):
        return Score(1.0, f"{_fmt(got)} matches {_fmt(want)}", written)
    return Score(0.0, f"{_fmt(got)} is off {_fmt(want)} by {_fmt(abs(got - want))}, beyond "
                 f"abs_tol {params['abs_tol']:g} / rel_tol {params['rel_tol']:g}", written)


# -- multiple choice --------------------------------------------------------------------


def _choice_validate(params: Mapping[str, Any] | None) -> Params:
    params = _take("choice", params, ("choices",))
    choices = params.get("choices", "ABCDE")
    if isinstance(choices, list) and all(isinstance(c, str) and len(c) == 1 for c in choices):
        choices = "".join(choices)
    if (not isinstance(choices, str) or not choices or len(set(choices)) != len(choices)
            or not all(len(c) == 1 and c.isalnum() for c in choices)):
        raise _fail("choice", "choices", "choices must be distinct single letters or digits, "
                    f"as a string or a list, e.g. \"ABCD\" (got {choices!r})")
    return {"choices": choices}


@lru_cache(maxsize=64)
def _choice_patterns(choices: str) -> tuple[re.Pattern[str], ...]:
    """Tiers of evidence for the letter, strongest first; the first tier that finds any
    letter decides. "answer is (B)" beats a "**B**" elsewhere; a reply that is only the
    letter counts, as does a lower-case letter that ends the reply after "answer:" ("Answer:
    b"; inside a sentence "the answer is a ..." is the article); decorated letters ((B),
    **B**, [B], "B)" at a line's start) come last."""
    c = "[" + re.escape(choices) + "]"
    lower = "".join(ch.lower() for ch in choices if ch.lower() not in choices)
    low = "[" + re.escape(lower) + "]" if lower else "(?!)"
    around = r"[\s(\[*_'\"]*"
    return (
        re.compile(r"(?i:answer(?:\s+is|\s*:|\s+would\s+be|\s+should\s+be)\s*:?\s*"
                   r"(?:option\s*)?)"
                   + around + "(" + c + r")(?!\w)"
                   + r"(?:[\s)\]*_'\".]*(?:or|and|/|,|&)" + around + "(" + c + r")(?!\w))?"),
        re.compile(r"^\W*(" + c + r")\W*$|(?i:answer(?:\s+is|\s*:))\s*" + around + "(" + low
                   + r")[\s)\]*_'\".!]*$"),
        re.compile(r"(?:^|\s)\((" + c + r")\)|\*\*(" + c + r")\*\*|\[(" + c + r")\]|^\s*("
                   + c + r")[).:](?:\s|$)", re.MULTILINE),
    )


def _letters(text: str, choices: str) -> list[str]:
    for tier in _choice_patterns(choices):
        found: list[str] = []
        for m in tier.finditer(text):
            for g in m.groups():
                letter = g if not g or g in choices else g.upper()
                if letter and letter not in found:
                    found.append(letter)
        if found:
            return found
    return []


def _reference_letter(ref: str, choices: str) -> str | None:
    """The reference's letter, decoration and case forgiven: "(b)" is B."""
    want = ref.strip().strip("()[]*. ")
    for letter in (want, want.upper()):
        if len(letter) == 1 and letter in choices:
            return letter
    return None


def _choice_reference(ref: str, params: Params) -> str | None:
    if _reference_letter(ref, params["choices"]) is None:
        return f"is not one of the choices {params['choices']}; give one letter, e.g. \"B\""
    return None


def _choice_one(answer: Answer, ref: str, params: Params) -> Score:
    choices = params["choices"]
    want = _reference_letter(ref, choices)
    if want is None:
        return Score(0.0, f"the reference {_show(ref)} is not one of {choices}")
    letters = _letters(unicodedata.normalize("NFKC", answer.text), choices)
    if not letters:
        return Score(0.0, f"no choice letter ({choices}) found in the answer")
    if len(letters) > 1:
        return Score(0.0, f"ambiguous: the answer gives {' and '.join(letters)}",
                     "".join(letters))
    if letters[0] == want:
        return Score(1.0, f"chose {want}", letters[0])
    return Score(0.0, f"chose {letters[0]}, the answer is {want}", letters[0])


# -- contains ---------------------------------------------------------------------------


def _contains_validate(params: Mapping[str, Any] | None) -> Params:
    params = _take("contains", params, ("mode", "case_sensitive", "partial"))
    return {
        "mode": _one_of("contains", params, "mode", ("any", "all"), "any"),
        "case_sensitive": _bool("contains", params, "case_sensitive", False),
        "partial": _bool("contains", params, "partial", False),
    }


def _contains_reference(ref: str, params: Params) -> str | None:
    if not ref.strip():
        return "is empty, and so in every answer; give the text to look for"
    return None


def _contains_score(answer: Answer, references: Sequence[str], params: Params) -> Score:
    if not references:
        return Score(0.0, "the item has no reference to look for")

    def prep(text: str) -> str:
        text = _WS_RE.sub(" ", unicodedata.normalize("NFKC", text))
        return text if params["case_sensitive"] else text.casefold()

    text = prep(answer.text)
    present = [ref for ref in references if prep(ref) in text]
    if params["mode"] == "any":
        if present:
            return Score(1.0, f"contains {_show(present[0])}", present[0])
        return Score(0.0, f"contains none of the {len(references)} references")
    missing = [ref for ref in references if ref not in present]
    if not missing:
        return Score(1.0, f"contains all {len(references)} references")
    value = len(present) / len(references) if params["partial"] else 0.0
    return Score(value, f"misses {len(missing)} of {len(references)} references, first "
                 f"{_show(missing[0])}")


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
        # The one compile of a user-given schema (compare.py): nothing outside it is fetched.
        compare.schema_validator(schema)
    except compare.SchemaRefused as exc:
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
        validator = compare.schema_validator(params["schema"])
    except compare.SchemaRefused as exc:  # stored before schemas were checked: never fetched
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


def _answer_calls(answer: Answer) -> tuple[list[compare.ToolCall], str]:
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
        return [compare.ToolCall(value["name"],
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


# -- instruction following ----------------------------------------------------------------

# A word: a run of letters or digits (any script), with apostrophes and hyphens inside it
# ("don't", "don’t" and "well-known" are one word each). Scripts written without spaces
# (Chinese, Japanese, Thai) read as one word per run.
_WORD_RE = re.compile(r"\w[\w'\u2019-]*")
_INSTRUCTION_KEYS = ("words", "min_words", "max_words", "lines", "case", "starts_with",
                     "ends_with", "forbid")


def _count(scorer: str, params: Params, key: str, least: int) -> int | None:
    value = params.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= 100_000:
        raise _fail(scorer, key, f"{key} must be a whole number from {least} to 100000 "
                    f"(got {value!r})")
    return value


def _affix(params: Params, key: str) -> str | None:
    value = params.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise _fail("instruction", key, f"{key} must be a non-empty string (got {value!r})")
    edge = value[0] if key == "starts_with" else value[-1]
    if edge.isspace():
        side = "begin" if key == "starts_with" else "end"
        raise _fail("instruction", key, f"{key} must not {side} with a space: the answer is "
                    f"compared with its ends stripped (got {value!r})")
    return value


def _instruction_validate(params: Mapping[str, Any] | None) -> Params:
    params = _take("instruction", params, _INSTRUCTION_KEYS)
    out: Params = {}
    for key, least in (("words", 1), ("min_words", 0), ("max_words", 1), ("lines", 1)):
        value = _count("instruction", params, key, least)
        if value is not None:
            out[key] = value
    if "words" in out and ("min_words" in out or "max_words" in out):
        raise _fail("instruction", "words", "give words (an exact count) or min_words / "
                    "max_words (a range), not both")
    if out.get("min_words", 0) > out.get("max_words", math.inf):
        raise _fail("instruction", "min_words", f"min_words ({out['min_words']}) is more than "
                    f"max_words ({out['max_words']})")
    if "case" in params:
        out["case"] = _one_of("instruction", params, "case", ("lower", "upper"), "lower")
    for key in ("starts_with", "ends_with"):
        affix = _affix(params, key)
        if affix is not None:
            out[key] = affix
    if "forbid" in params:
        forbid = params["forbid"]
        if (not isinstance(forbid, list) or not forbid
                or not all(isinstance(f, str) and f.strip() for f in forbid)):
            raise _fail("instruction", "forbid", "forbid must be a non-empty list of non-empty "
                        f'strings, e.g. ["sorry", "as an AI"] (got {forbid!r})')
        out["forbid"] = list(forbid)
    if not out:
        message = f"give at least one rule: {', '.join(_INSTRUCTION_KEYS)}"
        raise ScorerParamsError(f"scorer 'instruction': {message}", fields={"params": [message]})
    return out


def _plural(n: int, word: str) -> str:
    return f"{n} {word}{'' if n == 1 else 's'}"


def _instruction_score(answer: Answer, references: Sequence[str], params: Params) -> Score:
    """1 when the answer follows every rule; else 0 with the first rule it breaks, checked
    in a fixed order: word count, lines, case, start, end, forbidden text."""
    text = answer.text.strip()
    words = len(_WORD_RE.findall(text))
    said = _plural(words, "word")
    extracted = said if any(k in params for k in ("words", "min_words", "max_words")) else None
    if "words" in params and words != params["words"]:
        return Score(0.0, f"{said}; exactly {params['words']} asked", extracted)
    if "min_words" in params and words < params["min_words"]:
        return Score(0.0, f"{said}; at least {params['min_words']} asked", extracted)
    if "max_words" in params and words > params["max_words"]:
        return Score(0.0, f"{said}; at most {params['max_words']} asked", extracted)
    if "lines" in params:
        lines = sum(1 for line in text.splitlines() if line.strip())
        if lines != params["lines"]:
            return Score(0.0, f"{_plural(lines, 'non-empty line')}; exactly {params['lines']} "
                         "asked", extracted)
    case = params.get("case")
    if case is not None:
        wrong = next((ch for ch in text if (ch.isupper() if case == "lower" else ch.islower())),
                     None)
        if wrong is not None:
            return Score(0.0, f"not all {case} case: it has {wrong!r}", extracted)
    starts, ends = params.get("starts_with"), params.get("ends_with")
    if starts is not None and not text.startswith(starts):
        return Score(0.0, f"does not start with {_show(starts)}; starts "
                     f"{_show(text[:len(starts) + 10])}", extracted)
    if ends is not None and not text.endswith(ends):
        return Score(0.0, f"does not end with {_show(ends)}; ends "
                     f"{_show(text[-(len(ends) + 10):])}", extracted)
    folded = text.casefold()
    for phrase in params.get("forbid", ()):
        if phrase.casefold() in folded:
            return Score(0.0, f"contains {_show(phrase)}, which is forbidden", extracted)
    return Score(1.0, f"follows every rule ({', '.join(sorted(params))})", extracted)


# -- the registry -----------------------------------------------------------------------

SCORERS: dict[str, Scorer] = {s.name: s for s in (
    Scorer("exact", "the answer equals a reference (ends stripped unless strip=false)",
           _exact_validate, _best(_exact_one)),
    Scorer("normalised", "equal after NFKC, case folding, punctuation and whitespace",
           _normalised_validate, _best(_normalised_one)),
    Scorer("regex", "a regex's one group, extracted from the answer, equals a reference",
           _regex_validate, _regex_score),
    Scorer("numeric", "the answer's last (or first) number is within tolerance of a reference",
           _numeric_validate, _best(_numeric_one), check_reference=_numeric_reference),
    Scorer("choice", "the multiple-choice letter the answer gives is the reference's",
           _choice_validate, _best(_choice_one), check_reference=_choice_reference),
    Scorer("contains", "the answer contains any (or all) of the references",
           _contains_validate, _contains_score, check_reference=_contains_reference),
    Scorer("json", "the answer is valid JSON (optionally equal to a reference)",
           _json_validate, _json_score, needs_reference=False,
           check_reference=_json_reference),
    Scorer("json_schema", "the answer is JSON conforming to a JSON Schema",
           _schema_validate, _schema_score, needs_reference=False),
    Scorer("tool_call", "the answer calls the reference's tool with its arguments",
           _tool_validate, _best(_tool_one), check_reference=_tool_reference),
    Scorer("instruction", "the answer follows format rules: word and line counts, case, "
           "how it starts and ends, forbidden text", _instruction_validate, _instruction_score,
           needs_reference=False),
)}


def validate(name: str, params: Mapping[str, Any] | None) -> Params:
    """The scorer's parameters, checked, with every default filled in; ScorerParamsError
    (400) naming the parameter otherwise, or listing the scorers for an unknown name."""
    return _scorer(name).validate(params)


def validate_references(name: str, references: Any, params: Params) -> list[str]:
    """An item's references as the strings `score()` takes, checked against the scorer and
    its validated params: a number or an object (a tool call's reference) is written as
    JSON; ScorerParamsError (400) names the reference that can never be matched."""
    scorer = _scorer(name)
    if not isinstance(references, list):
        raise ScorerParamsError("references must be a list (give [] for none)",
                                fields={"references": ["must be a list"]})
    if scorer.needs_reference and not references:
        raise ScorerParamsError(f"scorer {name!r} needs at least one reference",
                                fields={"references": ["give at least one reference"]})
    out = []
    for i, ref in enumerate(references):
        if ref is None:
            problem: str | None = "is null; give a string"
        else:
            ref = ref if isinstance(ref, str) else json.dumps(ref, ensure_ascii=False)
            problem = scorer.check_reference(ref, params) if scorer.check_reference else None
        if problem is not None:
            quoted = "" if ref is None else f" ({_show(ref)})"
            message = f"reference {i + 1}{quoted} {problem}"
            raise ScorerParamsError(f"scorer {name!r}: {message}",
                                    fields={f"references.{i}": [message]})
        out.append(ref)
    return out


def _scorer(name: str) -> Scorer:
    scorer = SCORERS.get(name) if isinstance(name, str) else None
    if scorer is None:
        raise ScorerParamsError(
            f"unknown scorer {name!r}; give one of: {', '.join(SCORERS)}",
            fields={"scorer": [f"unknown scorer; known: {', '.join(SCORERS)}"]})
    return scorer


def _as_answer(answer: Answer | str) -> Answer:
    return answer if isinstance(answer, Answer) else Answer(text=str(answer))


def score(name: str, answer: Answer | str, references: Sequence[str], params: Params) -> Score:
    """Score `answer` against `references` with scorer `name` and its validated `params`.

    Never raises on any answer: a failed call, or an answer the scorer cannot read, scores
    0 with the reason. (An unknown `name` is a caller's bug and raises ScorerParamsError.)
    """
    scorer = _scorer(name)
    try:
        ans = _as_answer(answer)
        if ans.failed:
            what = f"status {ans.status}" if ans.status else "no response"
            detail = ": ".join(x for x in (ans.error_code, ans.error_message) if x)
            return Score(0.0, f"the call failed ({what}){': ' + detail if detail else ''}")
        refs = [str(r) for r in references]
        got = scorer.score(ans, refs, params)
    except Exception as exc:  # the promise: a run never dies on one answer
        return Score(0.0, f"the scorer could not read this answer: {type(exc).__name__}: "
                     f"{str(exc)[:200]}")
    if not 0.0 <= got.value <= 1.0:  # also catches NaN
        return Score(0.0, f"the scorer gave {got.value!r}, outside [0, 1]; scored 0",
                     got.extracted)
    return got
