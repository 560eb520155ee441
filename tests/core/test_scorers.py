"""The scorer registry: every scorer on hand-written answers, nasty ones included (unicode,
nested JSON, numbers with units, ambiguous letters, empty and failed answers, catastrophic
regexes), the parameter checks' messages, and a property: score() never raises and stays
in [0, 1] whatever the answer."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fleetctl.core.errors import DomainError
from fleetctl.evals.scorers import (
    SCORERS,
    Score,
    ScorerParamsError,
    json_same,
    normalise,
    score,
    validate,
    validate_references,
)
from fleetctl.inference.compare import Answer, ToolCall


def run(name: str, answer: Answer | str, refs: list[str], **params: Any) -> Score:
    return score(name, answer, refs, validate(name, params))


def params_error(name: str, params: Any) -> ScorerParamsError:
    with pytest.raises(ScorerParamsError) as info:
        validate(name, params)
    return info.value


# -- the registry ---------------------------------------------------------------------------


def test_registry_names_every_scorer_of_the_issue() -> None:
    assert set(SCORERS) == {"exact", "normalised", "regex", "numeric", "choice", "contains",
                            "json", "json_schema", "tool_call", "instruction"}
    for name, scorer in SCORERS.items():
        assert scorer.name == name and scorer.summary


def test_validate_fills_every_default_so_a_stored_suite_says_how_it_is_scored() -> None:
    assert validate("exact", None) == {"strip": True}
    assert validate("numeric", {"abs_tol": 0.5}) == {
        "abs_tol": 0.5, "rel_tol": 0.0, "pick": "last", "percent_as_fraction": False}
    assert validate("choice", {"choices": ["A", "B"]}) == {"choices": "AB"}
    assert validate("regex", {"pattern": r"is (\d+)", "flags": "si"})["flags"] == "is"


def test_unknown_scorer_lists_the_known_ones_and_is_a_400() -> None:
    err = params_error("bleu", {})
    assert isinstance(err, DomainError) and err.status_code == 400
    assert "unknown scorer 'bleu'" in err.message
    for name in SCORERS:
        assert name in err.message
    with pytest.raises(ScorerParamsError, match="unknown scorer"):
        score("bleu", "x", ["x"], {})


@pytest.mark.parametrize(("name", "params", "field", "words"), [
    ("exact", {"strp": True}, "params.strp", "unknown parameter 'strp'; known: strip"),
    ("exact", {"strip": "yes"}, "params.strip", "strip must be true or false"),
    ("exact", [1, 2], "params", "params must be an object"),
    ("normalised", {"case": 1}, "params.case", "case must be true or false"),
    ("regex", {}, "params.pattern", "pattern is required"),
    ("regex", {"pattern": "(a"}, "params.pattern", "does not compile"),
    ("regex", {"pattern": "a+"}, "params.pattern", "has 0 capturing groups; give exactly one"),
    ("regex", {"pattern": "(a)(b)"}, "params.pattern", "has 2 capturing groups"),
    ("regex", {"pattern": "(a)", "flags": "x"}, "params.flags", "string of i, m and s"),
    ("regex", {"pattern": "(a)", "timeout_s": 60}, "params.timeout_s", "at most 5"),
    ("regex", {"pattern": "(a)", "timeout_s": 0}, "params.timeout_s", "more than 0"),
    ("regex", {"pattern": "(a)", "occurrence": "middle"}, "params.occurrence", "first, last"),
    ("numeric", {"abs_tol": -1}, "params.abs_tol", "a number at least 0"),
    ("numeric", {"rel_tol": "1%"}, "params.rel_tol", "a number at least 0"),
    ("numeric", {"rel_tol": float("nan")}, "params.rel_tol", "a number at least 0"),
    ("numeric", {"abs_tol": True}, "params.abs_tol", "a number at least 0"),
    ("numeric", {"pick": "max"}, "params.pick", "last, first"),
    ("choice", {"choices": "AAB"}, "params.choices", "distinct single letters"),
    ("choice", {"choices": ""}, "params.choices", "distinct single letters"),
    ("choice", {"choices": ["AB", "C"]}, "params.choices", "distinct single letters"),
    ("contains", {"mode": "most"}, "params.mode", "any, all"),
    ("json", {"fences": None}, "params.fences", "true or false"),
    ("json_schema", {}, "params.schema", "schema is required"),
    ("json_schema", {"schema": "{}"}, "params.schema", "schema is required"),
    ("json_schema", {"schema": {"type": "nope"}}, "params.schema", "not a valid JSON Schema"),
    ("json_schema", {"schema": {"properties": {"a": {"minimum": "x"}}}}, "params.schema",
     "not a valid JSON Schema at properties/a/minimum"),
    ("tool_call", {"partial": 1}, "params.partial", "true or false"),
])
def test_bad_params_name_the_parameter_and_say_what_to_give(
        name: str, params: Any, field: str, words: str) -> None:
    err = params_error(name, params)
    assert words in err.message
    assert err.message.startswith(f"scorer {name!r}: ")
    assert list(err.fields) == [field]


def test_failed_calls_score_zero_with_the_status_and_error() -> None:
    failed = Answer.from_error(503, code="overloaded", message="try later")
    timeout = Answer.from_error(0)
    for name in SCORERS:
        params = validate(name, {"pattern": "(x)"} if name == "regex" else
                          {"schema": {}} if name == "json_schema" else
                          {"words": 1} if name == "instruction" else {})
        got = score(name, failed, ["x"], params)
        assert got == Score(0.0, "the call failed (status 503): overloaded: try later")
        assert score(name, timeout, ["x"], params).reason == "the call failed (no response)"


def test_empty_answers_score_zero_with_a_reason() -> None:
    cases = {"exact": {}, "normalised": {}, "regex": {"pattern": r"is (\w+)"}, "numeric": {},
             "choice": {}, "contains": {}, "json": {}, "json_schema": {"schema": {}},
             "tool_call": {}}
    for name, params in cases.items():
        got = run(name, "", ['{"name": "f", "arguments": {}}' if name == "tool_call" else "B"],
                  **params)
        assert got.value == 0.0 and got.reason, name


def test_several_references_score_the_best_of_them() -> None:
    assert run("exact", "Paris", ["London", "Paris"]).value == 1.0
    assert run("numeric", "about 3.14", ["3", "3.14"]).value == 1.0
    assert run("choice", "(C)", ["A", "C"]).value == 1.0
    got = run("tool_call", Answer(tool_calls=(ToolCall("f", '{"a": 1}'),)),
              ['{"name": "f", "arguments": {"a": 2}}', '{"name": "f", "arguments": {"a": 1}}'])
    assert got.value == 1.0


def test_no_reference_scores_zero_where_one_is_needed() -> None:
    assert run("exact", "x", []) == Score(0.0, "the item has no reference to compare with")
    assert run("contains", "x", []).value == 0.0
    assert run("json", "{}", []).value == 1.0  # validity needs no reference


def test_validate_references_writes_non_strings_as_json_and_keeps_strings() -> None:
    tool = {"name": "f", "arguments": {"city": "Zürich"}}
    params = validate("tool_call", {})
    assert validate_references("tool_call", [tool], params) == [
        '{"name": "f", "arguments": {"city": "Zürich"}}']
    assert validate_references("numeric", [42, "1,234.5"], validate("numeric", {})) == [
        "42", "1,234.5"]
    assert validate_references("json", [], validate("json", {})) == []
    assert validate_references("choice", ["(b)"], validate("choice", {})) == ["(b)"]


@pytest.mark.parametrize(("name", "params", "refs", "field", "words"), [
    ("exact", {}, [], "references", "needs at least one reference"),
    ("exact", {}, "Paris", "references", "references must be a list"),
    ("exact", {}, ["a", None], "references.1", "reference 2 is null; give a string"),
    ("numeric", {}, ["42", "n/a"], "references.1",
     "reference 2 ('n/a') has no number; give the expected number"),
    ("choice", {}, ["F"], "references.0", "is not one of the choices ABCDE"),
    ("choice", {"choices": "AB"}, ["AB"], "references.0", "give one letter"),
    ("contains", {}, ["  "], "references.0", "is empty"),
    ("json", {"equal": True}, ["{'a': 1}"], "references.0", "is not JSON"),
    ("tool_call", {}, ["get_weather(city='Paris')"], "references.0", "is not a tool call"),
    ("tool_call", {}, [{"arguments": {}}], "references.0", "is not a tool call"),
])
def test_references_that_can_never_match_are_refused_naming_them(
        name: str, params: dict[str, Any], refs: Any, field: str, words: str) -> None:
    with pytest.raises(ScorerParamsError) as info:
        validate_references(name, refs, validate(name, params))
    assert words in info.value.message
    assert list(info.value.fields) == [field]


# -- exact and normalised ------------------------------------------------------------------


def test_exact() -> None:
    assert run("exact", "  Paris\n", ["Paris"]) == Score(1.0, "equals the reference", "Paris")
    assert run("exact", "  Paris\n", ["Paris"], strip=False).value == 0.0
    got = run("exact", "paris", ["Paris"])
    assert got.value == 0.0 and got.reason == "'paris' differs from 'Paris'"
    # Composed and decomposed é are different strings; exact does not normalise.
    assert run("exact", "caf\u00e9", ["cafe\u0301"]).value == 0.0


def test_exact_reason_quotes_long_answers_cut() -> None:
    got = run("exact", "x" * 1000, ["y"])
    assert len(got.reason) < 150 and "…" in got.reason


def test_normalised_unicode_case_punctuation_whitespace() -> None:
    assert run("normalised", "caf\u00e9", ["cafe\u0301"]).value == 1.0  # NFKC composes
    assert run("normalised", "\uff30\uff41\uff52\uff49\uff53", ["paris"]).value == 1.0  # full-width
    assert run("normalised", "  New\u00a0York,\tCity!!", ["new york city"]).value == 1.0
    assert run("normalised", "STRASSE", ["straße"]).value == 1.0  # casefold, not lower
    assert run("normalised", "«Bonjour» ¿qué?", ["bonjour qué"]).value == 1.0
    assert run("normalised", "The Eiffel Tower", ["eiffel tower"]).value == 0.0
    assert run("normalised", "The Eiffel Tower", ["eiffel tower"], articles=True).value == 1.0
    assert run("normalised", "Paris", ["paris"], case=False).value == 0.0
    assert run("normalised", "Paris.", ["paris"], punctuation=False).value == 0.0
    got = run("normalised", "Lyon", ["Paris"])
    assert got == Score(0.0, "normalised 'lyon' differs from 'paris'", "lyon")


def test_normalise_helper() -> None:
    assert normalise("  A\u2009B\u3000C ") == "a b c"
    assert normalise("ﬁne", unicode=False, case=False) == "ﬁne"
    assert normalise("ﬁne") == "fine"


# -- regex ----------------------------------------------------------------------------------


def test_regex_extracts_the_group_and_compares_it() -> None:
    got = run("regex", "Reasoning... so the answer is Paris.", ["paris"],
              pattern=r"answer is (\w+)")
    assert got == Score(1.0, "the extracted text matches the reference", "Paris")
    assert run("regex", "answer is Paris", ["paris"], pattern=r"answer is (\w+)",
               compare="exact").value == 0.0
    got = run("regex", "x=1; x=2; x=3", ["3"], pattern=r"x=(\d)", occurrence="last")
    assert got.value == 1.0 and got.extracted == "3"
    assert run("regex", "x=1; x=2; x=3", ["3"], pattern=r"x=(\d)").extracted == "1"
    assert run("regex", "ANSWER: b", ["b"], pattern=r"answer: (\w)", flags="i").value == 1.0
    assert run("regex", "nothing here", ["x"], pattern=r"answer: (\w)") == Score(
        0.0, "the pattern does not match the answer")
    # An optional group that took no part in the match.
    assert run("regex", "ab", ["x"], pattern=r"a(c)?b").value == 0.0


def test_regex_unicode_answer() -> None:
    got = run("regex", "Réponse : «\u00c9lodie»", ["elodie"], pattern=r"«(\w+)»")
    assert got.extracted == "Élodie" and got.value == 0.0  # accents are kept
    assert run("regex", "Réponse : «\u00c9lodie»", ["élodie"], pattern=r"«(\w+)»").value == 1.0


def test_a_catastrophic_regex_times_out_and_scores_zero() -> None:
    # (a+)+$ on a's followed by a b backtracks exponentially; without the timeout this
    # test would not end. The scorer's own reason says it gave up.
    for pattern, text in [(r"(a+)+$", "a" * 5000 + "b"), (r"(a|aa)+$", "a" * 60 + "b")]:
        for occurrence in ("first", "last"):
            got = run("regex", text, ["a"], pattern=pattern, timeout_s=0.05,
                      occurrence=occurrence)
            assert got.value == 0.0
            assert got.reason.startswith("the pattern timed out after 0.05 s")


# -- numeric --------------------------------------------------------------------------------


@pytest.mark.parametrize(("answer", "ref", "extracted"), [
    ("42", "42", "42"),
    ("The distance is 42 km.", "42", "42"),
    ("It costs $1,234.50 in total", "1234.5", "$1,234.50"),
    ("Total: -$5", "-5", "-$5"),
    ("a drop of −12.5 points", "-12.5", "−12.5"),  # U+2212 minus
    ("roughly 6.02e23 molecules", "6.02×10^23 is 602000000000000000000000", "6.02e23"),
    ("about 1.5E-3 s", "0.0015", "1.5E-3"),
    ("growth was 12%", "12", "12%"),
    ("First 3 apples, then 7 pears, so 10 fruits", "10", "10"),
    ("\uff14\uff12", "42", "42"),  # full-width digits
    ("It is .5 of it", "0.5", ".5"),
    ("+7 degrees", "7", "+7"),
    ("1,234,567 people", "1234567", "1,234,567"),
    ("Answer: 3-4 hours, say 4", "4", "4"),
])
def test_numeric_reads_numbers_as_written(answer: str, ref: str, extracted: str) -> None:
    got = run("numeric", answer, [ref])
    assert got.value == 1.0, got
    assert got.extracted == extracted


def test_numeric_does_not_read_numbers_inside_words_or_versions() -> None:
    assert run("numeric", "version v2 of x86", ["2"]).reason == "no number in the answer"
    assert run("numeric", "see 1.2.3", ["3"]).value == 0.0  # 1.2, not 3
    assert run("numeric", "1,2345", ["2345"]).value == 1.0  # not a thousands group


def test_numeric_first_or_last_and_tolerances() -> None:
    assert run("numeric", "3 then 5", ["3"]).value == 0.0
    assert run("numeric", "3 then 5", ["3"], pick="first").value == 1.0
    got = run("numeric", "The answer is 10.4", ["10"])
    assert got.value == 0.0 and "10.4 is off 10 by 0.4" in got.reason
    assert run("numeric", "10.4", ["10"], abs_tol=0.5).value == 1.0
    assert run("numeric", "10.4", ["10"], rel_tol=0.05).value == 1.0
    assert run("numeric", "10.6", ["10"], abs_tol=0.5, rel_tol=0.05).value == 0.0
    assert run("numeric", "50%", ["0.5"], percent_as_fraction=True).value == 1.0
    assert run("numeric", "50%", ["0.5"]).value == 0.0
    assert run("numeric", "0.5", ["50%"], percent_as_fraction=True).value == 1.0


def test_numeric_unreadable_answers_and_references() -> None:
    assert run("numeric", "forty-two", ["42"]) == Score(0.0, "no number in the answer")
    assert run("numeric", "42", ["n/a"]).reason == "the reference 'n/a' has no number"
    assert run("numeric", "1e999999", ["1"]).value == 0.0  # overflows to inf: off, no crash


# -- multiple choice ------------------------------------------------------------------------


@pytest.mark.parametrize("answer", [
    "B", "(B)", "B)", "**B**", "B.", " b ".upper(), "The answer is (B).",
    "The answer is B because ...", "Answer: **B**", "Final answer: [B]",
    "Let me think. A is wrong because x. (B) fits.", "B) Paris\nbecause it is the capital",
    "the answer would be option B", "Ｂ",  # full-width
    "Answer: b", "The answer is (b).", "So the answer is **b**",
])
def test_choice_reads_the_letter(answer: str) -> None:
    got = run("choice", answer, ["B"])
    assert got == Score(1.0, "chose B", "B"), answer


@pytest.mark.parametrize(("answer", "reason"), [
    ("The answer is A or B", "ambiguous: the answer gives A and B"),
    ("The answer is (A) and (C)", "ambiguous: the answer gives A and C"),
    ("(A) or maybe (C)", "ambiguous: the answer gives A and C"),
    ("**A** ... **B**", "ambiguous: the answer gives A and B"),
    ("A)\nB)", "ambiguous: the answer gives A and B"),
])
def test_choice_ambiguous_answers_score_zero(answer: str, reason: str) -> None:
    got = run("choice", answer, ["B"])
    assert got.value == 0.0 and got.reason == reason


def test_choice_strong_evidence_beats_weak() -> None:
    # "answer is" decides over a decorated letter elsewhere.
    assert run("choice", "(A) is tempting, but the answer is C", ["C"]).value == 1.0


def test_choice_wrong_missing_and_custom_sets() -> None:
    assert run("choice", "(C)", ["B"]) == Score(0.0, "chose C, the answer is B", "C")
    assert run("choice", "I would say it is B", ["B"]).reason.startswith("no choice letter")
    assert run("choice", "The answer is a tricky one", ["A"]).value == 0.0  # the article
    assert run("choice", "Answer: c", ["c"], choices="abcd").value == 1.0
    assert run("choice", "(F)", ["F"]).reason.startswith("the reference 'F' is not one of")
    assert run("choice", "(F)", ["F"], choices="ABCDEF").value == 1.0
    assert run("choice", "The answer is 3", ["3"], choices="1234").value == 1.0
    assert run("choice", "(B)", ["(b)"]).value == 1.0  # reference decoration and case


# -- contains -------------------------------------------------------------------------------


def test_contains_any_all_case_partial() -> None:
    assert run("contains", "The capital is PARIS.", ["paris"]) == Score(
        1.0, "contains 'paris'", "paris")
    assert run("contains", "The capital is PARIS.", ["paris"], case_sensitive=True).value == 0.0
    assert run("contains", "Paris and Rome", ["rome", "berlin"]).value == 1.0
    got = run("contains", "Paris and Rome", ["rome", "berlin"], mode="all")
    assert got.value == 0.0 and got.reason == "misses 1 of 2 references, first 'berlin'"
    assert run("contains", "Paris and Rome", ["rome", "berlin"], mode="all",
               partial=True).value == 0.5
    assert run("contains", "Paris, Rome", ["rome", "paris"], mode="all").value == 1.0
    assert run("contains", "new\u00a0\u00a0york", ["New York"]).value == 1.0  # NFKC + spaces


# -- JSON -----------------------------------------------------------------------------------


def test_json_validity() -> None:
    assert run("json", '{"a": [1, {"b": null}]}', []) == Score(1.0, "valid JSON (the answer)")
    got = run("json", "Sure! ```json\n{\"a\": 1}\n```", [])
    assert got.value == 1.0 and "fence" in got.reason
    assert run("json", "```\n[1, 2]\n```", []).value == 1.0  # bare fence
    assert run("json", "```json\n{\"a\": 1}\n```", [], fences=False).value == 0.0
    assert run("json", "{'a': 1}", []).reason.startswith("not valid JSON")
    assert run("json", '{"a": NaN}', []).reason == "not valid JSON: NaN is not JSON"
    assert run("json", '{"a": 1', []).value == 0.0
    assert run("json", "", []).value == 0.0


def test_json_nested_too_deep_scores_zero_instead_of_crashing() -> None:
    assert run("json", "[" * 200_000 + "]" * 200_000, []) == Score(
        0.0, "not valid JSON: nested too deeply")


def test_json_equal_ignores_key_order_but_not_types() -> None:
    ref = '{"a": 1, "b": {"c": [true, "x"]}}'
    assert run("json", '{"b": {"c": [true, "x"]}, "a": 1.0}', [ref], equal=True).value == 1.0
    assert run("json", '{"b": {"c": [1, "x"]}, "a": 1}', [ref], equal=True).value == 0.0
    assert run("json", '{"a": 1}', ["not json", '{"a": 1}'], equal=True).value == 1.0
    assert json_same({"x": [1, 2]}, {"x": [1, 2]}) and not json_same([1, 2], [2, 1])
    assert not json_same(True, 1) and not json_same(None, 0) and not json_same("1", 1)


SCHEMA = {
    "type": "object", "required": ["name", "address"], "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "address": {"type": "object", "required": ["city"],
                    "properties": {"city": {"type": "string"},
                                   "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}},
        "tags": {"type": "array", "items": {"type": "string"}, "uniqueItems": True},
    },
}


def test_json_schema_conformance_with_nested_errors_located() -> None:
    ok = '{"name": "Zoë", "address": {"city": "Zürich", "zip": "80331"}, "tags": ["a"]}'
    assert run("json_schema", ok, [], schema=SCHEMA) == Score(
        1.0, "conforms to the schema (the answer)")
    got = run("json_schema", '{"name": "Z", "address": {"city": "Z", "zip": "8033"}}', [],
              schema=SCHEMA)
    assert got.value == 0.0 and got.reason.startswith("does not conform at address/zip")
    got = run("json_schema", '{"name": "Z", "address": {}}', [], schema=SCHEMA)
    assert got.reason.startswith("does not conform at address") and "city" in got.reason
    got = run("json_schema", '{"name": "Z", "address": {"city": "Z"}, "extra": 1}', [],
              schema=SCHEMA)
    assert got.value == 0.0
    got = run("json_schema", "```json\n" + ok + "\n```", [], schema=SCHEMA)
    assert got == Score(1.0, "conforms to the schema (a ``` fence)")
    assert run("json_schema", "not json", [], schema=SCHEMA).reason.startswith("not valid JSON")


def test_json_schema_is_draft_2020_12_by_default() -> None:
    # prefixItems exists only from 2020-12; an older draft would ignore it.
    schema = {"type": "array", "prefixItems": [{"type": "integer"}]}
    assert run("json_schema", '["x"]', [], schema=schema).value == 0.0
    assert run("json_schema", "[1]", [], schema=schema).value == 1.0


# -- tool calls -----------------------------------------------------------------------------

REF = '{"name": "get_weather", "arguments": {"city": "Paris", "units": "c", "days": 3}}'


def call(name: str, args: str) -> Answer:
    return Answer(tool_calls=(ToolCall(name, args),))


def test_tool_call_matches_ignoring_key_order() -> None:
    got = run("tool_call", call("get_weather", '{"days": 3, "units": "c", "city": "Paris"}'),
              [REF])
    assert got.value == 1.0 and got.extracted == "get_weather"
    # Arguments given as the API's JSON string in the reference.
    ref = '{"name": "f", "arguments": "{\\"x\\": [1, {\\"y\\": 2}]}"}'
    assert run("tool_call", call("f", '{"x": [1, {"y": 2}]}'), [ref]).value == 1.0


def test_tool_call_mismatches_and_partial_credit() -> None:
    wrong_name = run("tool_call", call("get_time", "{}"), [REF])
    assert wrong_name.value == 0.0 and "no call to 'get_weather'" in wrong_name.reason
    args = call("get_weather", '{"city": "Paris", "units": "f", "days": 3}')
    assert run("tool_call", args, [REF]).value == 0.0
    got = run("tool_call", args, [REF], partial=True)
    assert got.value == pytest.approx(0.5 + 0.5 * 2 / 3)
    assert run("tool_call", call("x", "{}"), [REF], partial=True).value == 0.0
    bad_args = run("tool_call", call("get_weather", "{city: Paris"), [REF], partial=True)
    assert bad_args.value == 0.5 and "not JSON" in bad_args.reason
    assert run("tool_call", call("get_weather", '{"city": "Paris", "units": "c", "days": true}'),
               [REF]).value == 0.0  # true is not 3, nor is it 1


def test_tool_call_picks_the_matching_call_among_several() -> None:
    answer = Answer(tool_calls=(ToolCall("lookup", "{}"),
                                ToolCall("get_weather", '{"city": "Paris", "units": "c", '
                                                        '"days": 3}')))
    assert run("tool_call", answer, [REF]).value == 1.0


def test_tool_call_written_as_text() -> None:
    text = 'I will call it:\n```json\n{"name": "get_weather", "arguments": ' \
           '{"city": "Paris", "units": "c", "days": 3}}\n```'
    got = run("tool_call", text, [REF])
    assert got.value == 1.0 and "from text" in got.reason
    assert run("tool_call", "The weather is nice", [REF]).reason == "the answer makes no tool call"


def test_tool_call_bad_reference_scores_zero() -> None:
    assert run("tool_call", call("f", "{}"), ["f()"]).reason.startswith(
        "the reference is not a tool call")
    assert run("tool_call", call("f", "{}"), ['{"arguments": {}}']).value == 0.0


# -- instruction following ----------------------------------------------------------------


def test_instruction_params_are_checked_and_need_at_least_one_rule() -> None:
    assert validate("instruction", {"words": 10}) == {"words": 10}
    assert validate("instruction", {"case": "upper", "forbid": ["x"]}) == \
        {"case": "upper", "forbid": ["x"]}
    err = params_error("instruction", {})
    assert "give at least one rule" in err.message and list(err.fields) == ["params"]
    assert params_error("instruction", None).fields == err.fields


@pytest.mark.parametrize(("params", "field", "words"), [
    ({"words": 0}, "params.words", "whole number from 1"),
    ({"words": 2.5}, "params.words", "whole number"),
    ({"words": True}, "params.words", "whole number"),
    ({"max_words": "10"}, "params.max_words", "whole number"),
    ({"lines": -1}, "params.lines", "whole number from 1"),
    ({"words": 5, "max_words": 10}, "params.words", "not both"),
    ({"min_words": 10, "max_words": 5}, "params.min_words", "is more than max_words (5)"),
    ({"case": "title"}, "params.case", "one of lower, upper"),
    ({"starts_with": ""}, "params.starts_with", "non-empty string"),
    ({"starts_with": " Dear"}, "params.starts_with", "must not begin with a space"),
    ({"ends_with": "bye\n"}, "params.ends_with", "must not end with a space"),
    ({"forbid": "sorry"}, "params.forbid", "non-empty list"),
    ({"forbid": []}, "params.forbid", "non-empty list"),
    ({"forbid": ["ok", " "]}, "params.forbid", "non-empty strings"),
    ({"word": 5}, "params.word", "unknown parameter 'word'"),
])
def test_instruction_bad_params_name_the_parameter(params: dict[str, Any], field: str,
                                                   words: str) -> None:
    err = params_error("instruction", params)
    assert words in err.message and list(err.fields) == [field]


def test_instruction_needs_no_reference_and_ignores_any() -> None:
    params = validate("instruction", {"words": 2})
    assert validate_references("instruction", [], params) == []
    assert score("instruction", "two words", [], params).value == 1.0
    assert score("instruction", "two words", ["something else"], params).value == 1.0


@pytest.mark.parametrize(("answer", "count"), [
    ("Hello, big world!", 3),
    ("don't stop", 2),
    ("don\u2019t stop", 2),  # a typographic apostrophe stays inside the word
    ("a well-known fact", 3),
    ("  spaced   out\n\nanswer  ", 3),
    ("Straße über café naïve", 4),  # letters of any script are word characters
    ("Ελληνικά και русский текст", 4),
    ("数字 42 and 3.5", 5),  # "3.5" is two runs of digits
    ("— ... !!! ---", 0),  # punctuation alone is no word
    ("", 0),
    ("日本語の文章", 1),  # scripts without spaces read as one word per run
])
def test_instruction_counts_words_as_runs_of_word_characters(answer: str, count: int) -> None:
    if count:  # an exact count of 0 is not a rule one can give
        got = run("instruction", answer, [], words=count)
        assert got.value == 1.0, got
    wrong = run("instruction", answer, [], words=count + 1)
    assert wrong.value == 0.0
    assert wrong.reason == f"{count} word{'' if count == 1 else 's'}; exactly {count + 1} asked"
    assert wrong.extracted == f"{count} word{'' if count == 1 else 's'}"


def test_instruction_word_ranges() -> None:
    assert run("instruction", "one two three", [], min_words=3, max_words=5).value == 1.0
    assert run("instruction", "one two", [], min_words=3).reason == "2 words; at least 3 asked"
    assert run("instruction", "a b c d e f", [], max_words=5).reason == \
        "6 words; at most 5 asked"
    assert run("instruction", "", [], min_words=0).value == 1.0


def test_instruction_lines_count_non_empty_lines() -> None:
    assert run("instruction", "one\n\n  \ntwo\r\nthree\n", [], lines=3).value == 1.0
    got = run("instruction", "one\ntwo", [], lines=3)
    assert (got.value, got.reason) == (0.0, "2 non-empty lines; exactly 3 asked")
    assert run("instruction", "just one", [], lines=2).reason == \
        "1 non-empty line; exactly 2 asked"


def test_instruction_case_is_unicode_aware() -> None:
    assert run("instruction", "all lower, 123 — ünïcödé ß", [], case="lower").value == 1.0
    got = run("instruction", "all lower except Ünï", [], case="lower")
    assert (got.value, got.reason) == (0.0, "not all lower case: it has 'Ü'")
    assert run("instruction", "ALL UPPER ÜBER ΣΊΣΥΦΟΣ 42!", [], case="upper").value == 1.0
    assert run("instruction", "UPPER STRAßE", [], case="upper").reason == \
        "not all upper case: it has 'ß'"
    assert run("instruction", "12 + 30 = 42", [], case="upper").value == 1.0  # no letters


def test_instruction_starts_and_ends_with_after_stripping() -> None:
    assert run("instruction", "  \nDear team, all good. Thanks.\n ", [],
               starts_with="Dear", ends_with="Thanks.").value == 1.0
    got = run("instruction", "Hi team, all good.", [], starts_with="Dear")
    assert (got.value, got.reason) == (0.0, "does not start with 'Dear'; starts 'Hi team, all g'")
    got = run("instruction", "All good. Cheers", [], ends_with="Thanks.")
    assert got.reason == "does not end with 'Thanks.'; ends 'All good. Cheers'"
    assert run("instruction", "dear team", [], starts_with="Dear").value == 0.0  # case counts


def test_instruction_forbid_is_case_insensitive() -> None:
    assert run("instruction", "Happy to help.", [], forbid=["sorry", "as an AI"]).value == 1.0
    got = run("instruction", "I'm SORRY, As An AI I cannot", [], forbid=["as an ai", "sorry"])
    assert (got.value, got.reason) == (0.0, "contains 'as an ai', which is forbidden")


def test_instruction_reports_the_first_broken_rule_in_a_fixed_order() -> None:
    params = {"words": 3, "case": "lower", "starts_with": "ok", "forbid": ["no"]}
    assert run("instruction", "No Way", [], **params).reason == "2 words; exactly 3 asked"
    assert run("instruction", "No Way out", [], **params).reason.startswith("not all lower")
    assert run("instruction", "no way out", [], **params).reason.startswith("does not start")
    assert run("instruction", "ok no way", [], **params).reason == \
        "contains 'no', which is forbidden"
    got = run("instruction", "ok fine then", [], **params)
    assert (got.value, got.reason) == \
        (1.0, "follows every rule (case, forbid, starts_with, words)")


@settings(max_examples=300, deadline=None)
@given(text=st.text(), words=st.integers(1, 30), lines=st.integers(1, 5),
       case=st.sampled_from(["lower", "upper"]), affix=st.text(min_size=1, max_size=5)
       .filter(lambda a: a.strip() and not a[0].isspace() and not a[-1].isspace()))
def test_instruction_never_raises_and_gives_zero_or_one(text: str, words: int, lines: int,
                                                        case: str, affix: str) -> None:
    for params in ({"words": words}, {"max_words": words, "lines": lines, "case": case},
                   {"starts_with": affix, "ends_with": affix, "forbid": [affix]}):
        got = score("instruction", text, [], validate("instruction", params))
        assert got.value in (0.0, 1.0) and got.reason


# -- never raises -----------------------------------------------------------------------------

ALL_PARAMS: dict[str, dict[str, Any]] = {
    "exact": {}, "normalised": {"articles": True},
    "regex": {"pattern": r"(\w+)$", "timeout_s": 0.05},
    "numeric": {"rel_tol": 0.01}, "choice": {}, "contains": {"mode": "all", "partial": True},
    "json": {"equal": True}, "json_schema": {"schema": SCHEMA}, "tool_call": {"partial": True},
    "instruction": {"min_words": 1, "max_words": 40, "lines": 1, "case": "lower",
                    "starts_with": "a", "ends_with": ".", "forbid": ["sorry"]},
}
VALIDATED = {name: validate(name, p) for name, p in ALL_PARAMS.items()}


@settings(max_examples=300, deadline=None)
@given(text=st.text(), refs=st.lists(st.text(max_size=20), max_size=3),
       name=st.sampled_from(sorted(SCORERS)))
def test_score_never_raises_and_stays_in_range(text: str, refs: list[str], name: str) -> None:
    got = score(name, text, refs, VALIDATED[name])
    assert 0.0 <= got.value <= 1.0
    assert isinstance(got.reason, str) and got.reason


JSONISH = st.text(alphabet='{}[]":,0123456789.-eE truefalsnABC\\()*\n`', max_size=80)


@settings(max_examples=300, deadline=None)
@given(text=JSONISH, refs=st.lists(JSONISH, max_size=3), name=st.sampled_from(sorted(SCORERS)),
       calls=st.lists(st.tuples(st.sampled_from(["f", "get_weather", ""]), JSONISH),
                      max_size=2))
def test_score_never_raises_on_near_json_and_tool_calls(
        text: str, refs: list[str], name: str, calls: list[tuple[str, str]]) -> None:
    answer = Answer(text=text, tool_calls=tuple(ToolCall(n, a) for n, a in calls))
    got = score(name, answer, [*refs, REF], VALIDATED[name])
    assert 0.0 <= got.value <= 1.0 and got.reason


def test_a_scorer_bug_scores_zero_with_the_reason() -> None:
    # Params that skipped validate(): the scorer fails on the missing key, score() does not.
    got = score("numeric", "42", ["42"], {})
    assert got.value == 0.0
    assert got.reason.startswith("the scorer could not read this answer: KeyError")
