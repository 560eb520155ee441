"""What every scorer shares: the Score and Scorer types, the parameter checks, quoting,
best-of-references, normalisation and strict JSON reading. Pure, like the scorers."""

from __future__ import annotations

import json
import math
import re
import unicodedata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fleetctl.core.errors import DomainError
from fleetctl.inference.compare import Answer

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
