"""The bundled suites: the same bytes everywhere, valid suites, and every item's scorer gives
the right answer 1 and a typical wrong one 0 (answers built from the item itself, not by the
simulator's solver: tests/sim/test_tasks.py ties the two together)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections import Counter
from typing import Any

import pytest

from fleetctl.evals import bundled, scorers
from fleetctl.evals.suites import canonical_jsonl, parse_suite

WORDS = ("calm", "rain", "falls", "on", "the", "quiet", "harbor", "while", "people", "walk",
         "home", "slowly", "under", "grey", "clouds", "and", "boats", "drift", "past", "stone",
         "walls", "again")
FAMILY_SUITES = [f"fleetctl-{family}" for family in bundled.FAMILIES]


def _items(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in bundled.suite_lines(name)[1:]]


def test_the_suites_are_named_as_the_spec_says() -> None:
    assert set(bundled.SUITES) == {*FAMILY_SUITES, bundled.MIX}
    for family in bundled.FAMILIES:
        spec = bundled.SUITES[f"fleetctl-{family}"]
        assert (spec["family"], spec["n"]) == (family, 300)
    assert bundled.SUITES[bundled.MIX]["family"] == "mix"
    assert bundled.SUITES[bundled.MIX]["n"] == 1200
    assert len({spec["seed"] for spec in bundled.SUITES.values()}) == 5
    with pytest.raises(KeyError, match="no bundled suite 'nope'"):
        bundled.suite_lines("nope")


def test_suite_lines_are_identical_on_every_call_and_in_another_process() -> None:
    here = {name: bundled.suite_lines(name) for name in bundled.SUITES}
    assert here == {name: bundled.suite_lines(name) for name in bundled.SUITES}
    script = ("import hashlib, sys; from fleetctl.evals import bundled; "
              "sys.stdout.write(' '.join(hashlib.sha256(bundled.suite_bytes(n)).hexdigest() "
              "for n in bundled.SUITES))")
    digests = set()
    for hash_seed in ("1", "2"):  # str hashing differs between these processes
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              check=True, env={**os.environ, "PYTHONHASHSEED": hash_seed})
        digests.add(done.stdout)
    assert len(digests) == 1

    assert digests.pop().split() == [hashlib.sha256(bundled.suite_bytes(n)).hexdigest()
                                     for n in bundled.SUITES]


def test_header_and_counts() -> None:
    for name, spec in bundled.SUITES.items():
        lines = bundled.suite_lines(name)
        header = json.loads(lines[0])
        assert header["fleetctl_eval_suite"] == 1
        assert header["decoding"] == {"temperature": 0, "seed": 0, "max_tokens": 128}
        assert header["description"] == spec["description"]
        items = [json.loads(line) for line in lines[1:]]
        assert len(items) == spec["n"]
        assert len({item["id"] for item in items}) == spec["n"]
        assert all("\n" not in line for line in lines)


def test_the_mix_is_every_family_item_once_tagged_by_family() -> None:
    mix = _items(bundled.MIX)
    families = [item for name in FAMILY_SUITES for item in _items(name)]
    assert sorted(mix, key=lambda i: i["id"]) == sorted(families, key=lambda i: i["id"])
    assert Counter(item["tags"][0] for item in mix) == {f: 300 for f in bundled.FAMILIES}
    # Shuffled, so the first hundred items (a run's first progress) cover every family.
    assert {item["tags"][0] for item in mix[:100]} == set(bundled.FAMILIES)


@pytest.mark.parametrize("name", [*FAMILY_SUITES, bundled.MIX])
def test_every_suite_parses_and_round_trips(name: str) -> None:
    assert "instruction" in scorers.SCORERS, "the bundled suites need the instruction scorer"
    data = bundled.suite_bytes(name)
    parsed = parse_suite(data.splitlines(keepends=True), max_items=100_000)
    assert len(parsed.items) == bundled.SUITES[name]["n"]
    assert parsed.decoding["seed"] == 0 and parsed.decoding["temperature"] == 0
    canonical = canonical_jsonl(parsed.description, parsed.decoding, parsed.items)
    assert parse_suite(canonical.splitlines(keepends=True), max_items=100_000) == parsed


def test_items_are_varied() -> None:
    tags = Counter(tag for item in _items(bundled.MIX) for tag in item["tags"][1:2])
    # Several templates per family, each used for a fair share of its 300 items.
    assert sum(1 for t in tags if t.startswith("op:")) >= 8
    assert sum(1 for t in tags if t.startswith("about:")) == 3
    assert sum(1 for t in tags if t.startswith("rule:")) >= 8
    assert sum(1 for t in tags if t.startswith("kind:")) >= 5
    assert min(tags.values()) >= 30
    texts = [item["messages"][-1]["content"] for item in _items(bundled.MIX)]
    assert len(set(texts)) == len(texts)  # no two items ask the same thing


# -- right answers score 1, typical wrong ones 0 ----------------------------------------


def _right_and_wrong(item: dict[str, Any]) -> tuple[str, str]:
    """A right and a typically wrong answer, built from the item's references and params."""
    scorer, params, refs = item["scorer"], item["params"], item["references"]
    if scorer == "numeric":
        return f"So the answer is {refs[0]}.", f"So the answer is {int(refs[0]) + 1}."
    if scorer == "choice":
        other = next(c for c in "ABCD" if c != refs[0])
        return f"The answer is {refs[0]}.", f"The answer is {other}."
    if scorer == "json_schema":
        values = {k: v["const"] for k, v in params["schema"]["properties"].items()}
        key = next(iter(values))
        value = values[key]
        wrong = {**values, key: value + 1 if isinstance(value, int) else value + "x"}
        return json.dumps(values), json.dumps(wrong)
    assert scorer == "instruction", scorer
    [(rule, value)] = params.items()
    words = list(WORDS)
    if rule == "words":
        return " ".join(words[:value]) + ".", " ".join(words[:value + 1]) + "."
    if rule == "max_words":
        return " ".join(words[:value - 1]) + ".", " ".join(words[:value + 2]) + "."
    if rule == "case":
        lower = " ".join(words[:6]) + "."
        return (lower, lower.capitalize()) if value == "lower" else (lower.upper(),
                                                                    lower.capitalize())
    if rule == "starts_with":
        return f"{value} " + " ".join(words[:5]) + ".", "Well " + " ".join(words[:5]) + "."
    if rule == "ends_with":
        return "Calm rain falls. " + value, "Calm rain falls."
    if rule == "lines":
        return "\n".join(words[:value]), "\n".join(words[:value + 1])
    if rule == "forbid":
        return "Calm rain falls on the harbor.", f"Calm {value[0]} falls on the harbor."
    raise AssertionError(f"unexpected rule {rule}")


@pytest.mark.parametrize("name", FAMILY_SUITES)
def test_each_items_scorer_gives_right_1_and_wrong_0(name: str) -> None:
    checked = 0
    for item in _items(name):
        assert item["scorer"] in scorers.SCORERS, f"unknown scorer {item['scorer']!r}"
        params = scorers.validate(item["scorer"], item["params"])
        refs = scorers.validate_references(item["scorer"], item["references"], params)
        right, wrong = _right_and_wrong(item)
        got = scorers.score(item["scorer"], right, refs, params)
        assert got.value == 1.0, (item["id"], right, got)
        got = scorers.score(item["scorer"], wrong, refs, params)
        assert got.value == 0.0, (item["id"], wrong, got)
        checked += 1
    assert checked == 300


def test_extraction_schemas_pin_every_value() -> None:
    for item in _items("fleetctl-extraction"):
        schema = item["params"]["schema"]
        assert schema["additionalProperties"] is False
        assert set(schema["required"]) == set(schema["properties"])
        assert all(set(p) == {"const"} for p in schema["properties"].values())
        # Every value is in the text it is extracted from.
        text = item["messages"][0]["content"]
        assert all(str(p["const"]) in text for p in schema["properties"].values())
