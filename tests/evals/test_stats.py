"""An eval run's statistics: textbook intervals, an A/A run that passes at exactly 0, a
5-point drop that fails, too few items that stay insufficient, items scored on one side only
left out of the pairing, the per-tag breakdown, the bootstrap for scores between 0 and 1, and
(hypothesis) intervals that hold their estimate and a difference that flips with the sides."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetctl.evals import stats

CAND, PRIM = "mi300x-us", "h200-us"


def rows_for(candidate: list[float | None], primary: list[float | None],
             tags: list[list[str]] | None = None) -> list[dict[str, Any]]:
    """One row per item and pool (item i of each list is the same item)."""
    out = []
    for i, (c, p) in enumerate(zip(candidate, primary, strict=True)):
        item_tags = tags[i] if tags else []
        out.append({"pool": CAND, "item": f"item-{i:04d}", "score": c, "tags": item_tags})
        out.append({"pool": PRIM, "item": f"item-{i:04d}", "score": p, "tags": item_tags})
    return out


def table(both: int, only_candidate: int, only_primary: int,
          neither: int) -> tuple[list[float | None], list[float | None]]:
    candidate = [1.0] * both + [1.0] * only_candidate + [0.0] * only_primary + [0.0] * neither
    primary = [1.0] * both + [0.0] * only_candidate + [1.0] * only_primary + [0.0] * neither
    return list(candidate), list(primary)


def run(rows: list[dict[str, Any]], *, primary: str | None = PRIM, margin: float = 0.02,
        min_items: int = 100, confidence: float = 0.95) -> dict[str, Any]:
    return stats.run_statistics(rows, candidate=CAND, primary=primary, margin=margin,
                                confidence=confidence, min_items=min_items)


# --- known tables -------------------------------------------------------------------------------

def test_a_pool_of_0_1_scores_gets_the_wilson_interval():
    # Wilson 95 % for 5/20 (Newcombe 1998, single proportion): 0.1119 to 0.4687.
    out = run(rows_for([1.0] * 5 + [0.0] * 15, [1.0] * 20), min_items=1)
    pool = out["pools"][CAND]
    assert (pool["n"], pool["score"], pool["method"]) == (20, 0.25, "wilson")
    assert pool["lower"] == pytest.approx(0.1119, abs=5e-5)
    assert pool["upper"] == pytest.approx(0.4687, abs=5e-5)
    assert out["pools"][PRIM]["upper"] == 1.0


def test_the_paired_difference_of_a_known_table_is_newcombes_with_the_exact_mcnemar_p():
    # Newcombe 1998 (Statistics in Medicine 17:873), table II, example (a): 36 both, 12 only
    # one side, 2 only the other, 0 neither; method 10 gives 0.0569 to 0.3404.
    candidate, primary = table(36, 12, 2, 0)
    paired = run(rows_for(candidate, primary), min_items=1)["paired"]
    assert paired["n"] == 50 and paired["estimate"] == pytest.approx(0.2)
    assert paired["lower"] == pytest.approx(0.0569, abs=5e-5)
    assert paired["upper"] == pytest.approx(0.3404, abs=5e-5)
    assert (paired["method"], paired["test"]) == ("newcombe-paired", "mcnemar-exact")
    # Exact McNemar: two-sided binomial on 2 of 14 discordant pairs = 2·(1 + 14 + 91) / 2¹⁴.
    assert paired["p_value"] == pytest.approx(212 / 16384)
    # Newcombe's example (c), all 8 pairs concordant: −0.3244 to +0.3244.
    concordant = run(rows_for(*table(8, 0, 0, 0)), min_items=1)["paired"]
    assert concordant["estimate"] == 0 and concordant["p_value"] == 1.0
    assert concordant["lower"] == pytest.approx(-0.3244, abs=5e-5)
    assert concordant["upper"] == pytest.approx(0.3244, abs=5e-5)


# --- verdicts -----------------------------------------------------------------------------------

def test_an_a_a_run_with_identical_scores_passes_at_exactly_zero():
    rng = random.Random(1)
    scores: list[float | None] = [float(rng.random() < 0.92) for _ in range(1200)]
    out = run(rows_for(scores, list(scores)))
    assert out["verdict"] == "pass"
    paired = out["paired"]
    assert (paired["n"], paired["estimate"], paired["p_value"]) == (1200, 0.0, 1.0)
    assert -0.02 <= paired["lower"] < 0 < paired["upper"]
    assert out["pools"][CAND] == out["pools"][PRIM]
    assert out["summary"].startswith(f"pass: {CAND} \u2212 {PRIM} +0.0 pts [")
    assert "over 1200 items" in out["summary"]
    assert "the lower bound is within the margin (margin 2 pts, 95 % confidence)" in out[
        "summary"]
    assert stats.verdict_for_evidence(out["verdict"]) == "pass"


def test_a_five_point_drop_on_1200_items_fails():
    # The candidate is wrong wherever the primary is, and on 60 more items (5 points).
    rng = random.Random(2)
    primary: list[float | None] = [float(rng.random() < 0.92) for _ in range(1200)]
    right = [i for i, s in enumerate(primary) if s == 1.0]
    worse = set(rng.sample(right, 60))
    candidate: list[float | None] = [0.0 if i in worse else s for i, s in enumerate(primary)]
    out = run(rows_for(candidate, primary))
    paired = out["paired"]
    assert paired["estimate"] == pytest.approx(-0.05)
    assert paired["upper"] < -0.02
    assert out["verdict"] == paired["verdict"] == "fail"
    assert paired["p_value"] < 1e-10
    assert "the whole interval is worse than the margin of −2.00 pts" in out["explanation"]
    assert out["summary"].startswith(f"fail: {CAND} \u2212 {PRIM} \u22125.0 pts [")
    assert stats.verdict_for_evidence("fail") == "fail"


def test_a_drop_near_the_margin_warns():
    # 2.5 points lower on 400 items: the interval straddles −2 points.
    candidate, primary = table(360, 0, 10, 30)
    out = run(rows_for(candidate, primary))
    assert out["verdict"] == "warn"
    assert out["paired"]["lower"] < -0.02 < out["paired"]["upper"]
    assert "more items would settle it" in out["summary"]


def test_below_min_items_the_verdict_is_insufficient_whatever_the_interval():
    candidate, primary = table(0, 0, 99, 0)  # the candidate is wrong on all 99
    out = run(rows_for(candidate, primary), min_items=100)
    assert out["verdict"] == "insufficient"
    assert out["paired"]["estimate"] == -1.0
    assert "only 99 items scored on both; at least 100 are needed" in out["summary"]
    assert stats.verdict_for_evidence("insufficient") == "info"
    # One more item and the same data fails.
    candidate, primary = table(0, 0, 100, 0)
    assert run(rows_for(candidate, primary), min_items=100)["verdict"] == "fail"


def test_without_a_primary_or_any_pair_the_verdict_is_insufficient_and_says_why():
    candidate, primary = table(150, 0, 0, 0)
    alone = run(rows_for(candidate, primary), primary=None)
    assert alone["verdict"] == "insufficient" and alone["paired"] is None
    assert alone["summary"].startswith("insufficient: no primary to compare with")
    assert "name a primary pool to get a verdict" in alone["summary"]
    assert alone["pools"][CAND]["n"] == 150
    unscored = run(rows_for([None] * 150, [1.0] * 150))
    assert unscored["verdict"] == "insufficient"
    assert unscored["paired"]["n"] == 0 and unscored["paired"]["estimate"] is None
    assert unscored["pools"][CAND] == {"n": 0, "score": None, "lower": None, "upper": None,
                                       "method": None}
    assert unscored["summary"] == (f"insufficient: no item scored on both {CAND} and {PRIM} "
                                   f"yet (need 100)")
    # A pool named but with no row at all still appears.
    assert run([], primary=PRIM)["pools"][PRIM]["n"] == 0


def test_items_scored_on_one_side_only_are_left_out_of_the_pairing():
    candidate: list[float | None] = [1.0] * 100 + [None] * 5 + [0.0] * 7
    primary: list[float | None] = [1.0] * 100 + [1.0] * 5 + [None] * 7
    out = run(rows_for(candidate, primary))
    paired = out["paired"]
    # The 7 items the candidate got wrong have no primary score: they do not count against it.
    assert (paired["n"], paired["estimate"]) == (100, 0.0)
    assert (paired["candidate_only"], paired["primary_only"]) == (7, 5)
    assert out["pools"][CAND]["n"] == 107 and out["pools"][PRIM]["n"] == 105
    assert out["pools"][CAND]["score"] == pytest.approx(100 / 107)
    # An "other" pool in the run gets its score too, and does not enter the pairing.
    extra = [*rows_for(candidate, primary),
             *({"pool": "a100-legacy", "item": f"item-{i:04d}", "score": 0.0, "tags": []}
               for i in range(112))]
    with_other = run(extra)
    assert with_other["pools"]["a100-legacy"]["score"] == 0.0
    assert with_other["paired"] == paired


def test_row_order_does_not_change_a_single_figure():
    rng = random.Random(3)
    candidate: list[float | None] = [rng.choice([0.0, 0.25, 0.5, 1.0]) for _ in range(300)]
    primary: list[float | None] = [rng.choice([0.0, 0.5, 1.0]) for _ in range(300)]
    rows = rows_for(candidate, primary, [[f"t{i % 3}"] for i in range(300)])
    shuffled = list(rows)
    random.Random(4).shuffle(shuffled)
    assert run(shuffled) == run(rows)


# --- tags ---------------------------------------------------------------------------------------

def test_each_tag_gets_its_pools_and_paired_difference_and_a_regressed_tag_is_flagged():
    # 600 items: "arithmetic" ones the candidate gets all wrong on "op:divide" (100 items);
    # everything else the same on both sides.
    tags = ([["arithmetic", "op:divide"]] * 100 + [["arithmetic", "op:add"]] * 200
            + [["format"]] * 300)
    primary: list[float | None] = [1.0] * 600
    candidate: list[float | None] = [0.0] * 100 + [1.0] * 500
    out = run(rows_for(candidate, primary, tags))
    assert sorted(out["tags"]) == ["arithmetic", "format", "op:add", "op:divide"]
    divide = out["tags"]["op:divide"]
    assert divide["n"] == 100 and divide["regressed"] is True
    assert divide["pools"][CAND]["score"] == 0.0 and divide["pools"][PRIM]["score"] == 1.0
    assert divide["paired"]["estimate"] == -1.0 and divide["paired"]["upper"] < -0.02
    # No verdict per tag: the run's verdict is the gate.
    assert "verdict" not in divide["paired"]
    arithmetic = out["tags"]["arithmetic"]
    assert arithmetic["n"] == 300 and arithmetic["regressed"] is True
    assert arithmetic["paired"]["estimate"] == pytest.approx(-1 / 3)
    assert out["tags"]["op:add"]["regressed"] is False
    assert out["tags"]["format"]["paired"]["estimate"] == 0.0
    assert out["regressed_tags"] == ["arithmetic", "op:divide"]
    assert out["summary"].endswith("; regressed tags: arithmetic, op:divide")
    assert json.loads(json.dumps(out, allow_nan=False)) == out
    assert out["verdict"] == "fail"


def test_without_the_breakdown_the_verdict_and_figures_are_the_same():
    tags = [["a"]] * 50 + [["b"]] * 100
    rows = rows_for([0.0] * 50 + [1.0] * 100, [1.0] * 150, tags)
    full = run(rows)
    lean = stats.run_statistics(rows, candidate=CAND, primary=PRIM, margin=0.02,
                                confidence=0.95, min_items=100, breakdown=False)
    assert (lean["tags"], lean["regressed_tags"]) == ({}, [])
    assert full["regressed_tags"] == ["a"]
    assert {k: v for k, v in lean.items() if k not in ("tags", "regressed_tags", "summary")} \
        == {k: v for k, v in full.items() if k not in ("tags", "regressed_tags", "summary")}
    assert full["summary"] == lean["summary"] + "; regressed tags: a"


def test_a_tag_without_pairs_has_empty_figures_and_is_not_flagged():
    rows = rows_for([1.0] * 120 + [None], [1.0] * 120 + [0.0],
                    [["common"]] * 120 + [["rare"]])
    rare = run(rows)["tags"]["rare"]
    assert rare["n"] == 1 and rare["regressed"] is False
    assert rare["paired"]["n"] == 0 and rare["paired"]["upper"] is None
    assert rare["pools"][CAND]["n"] == 0 and rare["pools"][PRIM]["score"] == 0.0


def test_without_a_primary_tags_have_no_paired_difference():
    out = run(rows_for([1.0, 0.0], [None, None], [["a"], ["a", "b"]]), primary=None)
    assert out["tags"]["a"]["paired"] is None and out["tags"]["a"]["regressed"] is False
    assert out["tags"]["a"]["pools"][CAND]["score"] == 0.5


# --- scores between 0 and 1 ---------------------------------------------------------------------

def test_scores_between_0_and_1_use_the_bootstrap():
    rng = random.Random(5)
    primary: list[float | None] = [rng.choice([0.0, 0.5, 0.75, 1.0]) for _ in range(400)]
    candidate: list[float | None] = [max(0.0, (p or 0.0) - 0.25) if i % 2 else p
                                     for i, p in enumerate(primary)]
    out = run(rows_for(candidate, primary))
    assert out["pools"][CAND]["method"] == out["pools"][PRIM]["method"] == "bootstrap-bca"
    paired = out["paired"]
    assert (paired["method"], paired["test"], paired["p_value"]) == (
        "paired-bootstrap-bca", None, None)
    assert paired["lower"] < paired["estimate"] < paired["upper"] < 0
    assert out["verdict"] == "fail"
    # Deterministic: the bootstrap's seed is fixed. JSON-ready (EvalRun.stats, evidence data).
    assert run(rows_for(candidate, primary)) == out
    assert json.loads(json.dumps(out, allow_nan=False)) == out
    # One side binary and the other not: still the bootstrap for the difference.
    mixed = run(rows_for([1.0] * 200, [0.5] * 200))
    assert mixed["pools"][CAND]["method"] == "wilson"
    assert mixed["pools"][PRIM]["method"] == "bootstrap-bca"
    assert mixed["paired"]["method"] == "paired-bootstrap-bca"
    assert mixed["paired"]["estimate"] == 0.5


# --- properties ---------------------------------------------------------------------------------

BINARY = st.sampled_from([0.0, 1.0])
FRACTION = st.sampled_from([0.0, 0.2, 0.5, 0.8, 1.0])
SCORE = st.one_of(st.none(), BINARY, FRACTION)


@st.composite
def score_lists(draw: st.DrawFn) -> tuple[list[float | None], list[float | None]]:
    values = draw(st.sampled_from([BINARY, st.one_of(st.none(), BINARY), SCORE]))
    n = draw(st.integers(min_value=1, max_value=60))
    return (draw(st.lists(values, min_size=n, max_size=n)),
            draw(st.lists(values, min_size=n, max_size=n)))


PROPERTY = settings(max_examples=80, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(score_lists())
def test_every_interval_contains_its_estimate(scores):
    candidate, primary = scores
    out = run(rows_for(candidate, primary, [["t"]] * len(candidate)), min_items=1)
    blocks = [*out["pools"].values(), out["paired"], *out["tags"]["t"]["pools"].values(),
              out["tags"]["t"]["paired"]]
    for block in blocks:
        value = block.get("score", block.get("estimate"))
        if block["n"] == 0:
            assert value is None and block["lower"] is None
            continue
        assert block["lower"] - 1e-12 <= value <= block["upper"] + 1e-12, block


@PROPERTY
@given(score_lists())
def test_swapping_the_sides_negates_the_difference(scores):
    candidate, primary = scores
    forward = run(rows_for(candidate, primary), min_items=1)["paired"]
    backward = run(rows_for(primary, candidate), min_items=1)["paired"]
    assert backward["n"] == forward["n"]
    assert (backward["candidate_only"], backward["primary_only"]) == (
        forward["primary_only"], forward["candidate_only"])
    if forward["n"] == 0:
        assert backward["estimate"] is None
        return
    assert backward["estimate"] == pytest.approx(-forward["estimate"], abs=1e-12)
    assert backward["lower"] == pytest.approx(-forward["upper"], abs=1e-9)
    assert backward["upper"] == pytest.approx(-forward["lower"], abs=1e-9)
