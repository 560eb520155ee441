"""The scorers that read an answer's text: exact, normalised, regex, numeric, choice,
contains and instruction following. docs/scorers.md describes each."""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import regex

from fleetctl.evals.scorers.base import (
    _NORMALISE_KEYS,
    _WS_RE,
    REGEX_TIMEOUT_MAX_S,
    REGEX_TIMEOUT_S,
    Params,
    Score,
    ScorerParamsError,
    _best,
    _bool,
    _fail,
    _nonneg,
    _normalise_params,
    _normalise_with,
    _one_of,
    _show,
    _take,
)
from fleetctl.inference.compare import Answer

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
