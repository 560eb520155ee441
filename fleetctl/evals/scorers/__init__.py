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

This module is the registry; the scorers are in `text.py` (what an answer says) and
`structured.py` (JSON, JSON Schema, tool calls), and what they share in `base.py`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from fleetctl.evals.scorers.base import (
    Params,
    Score,
    Scorer,
    ScorerParamsError,
    _best,
    _show,
    json_same,
    normalise,
)
from fleetctl.evals.scorers.structured import (
    _json_reference,
    _json_score,
    _json_validate,
    _schema_score,
    _schema_validate,
    _tool_one,
    _tool_reference,
    _tool_validate,
)
from fleetctl.evals.scorers.text import (
    _choice_one,
    _choice_reference,
    _choice_validate,
    _contains_reference,
    _contains_score,
    _contains_validate,
    _exact_one,
    _exact_validate,
    _instruction_score,
    _instruction_validate,
    _normalised_one,
    _normalised_validate,
    _numeric_one,
    _numeric_reference,
    _numeric_validate,
    _regex_score,
    _regex_validate,
)
from fleetctl.inference.compare import Answer

# What callers use: the registry and its three calls, and the types and helpers they name.
__all__ = ["SCORERS", "Params", "Score", "Scorer", "ScorerParamsError", "json_same",
           "normalise", "score", "validate", "validate_references"]

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
