"""An eval run's statistics: each pool's score with its interval, candidate − primary paired on
the items both scored, the verdict against the plan's quality margin, and the same per tag so
a lead sees which kind of task regressed. Pure (no Django, no I/O): services.run_finish hands
it the result rows, the power benchmark (benchmarks/eval_power.py) simulated ones.

Every interval comes from fleetctl.inference.confidence, so an eval verdict reads like a shadow
verdict: a pool's score is a Wilson interval when every score is 0 or 1 and a BCa bootstrap
otherwise; the paired difference is Newcombe's paired interval with the exact McNemar p-value
for 0/1 scores and a paired BCa bootstrap otherwise; confidence.judge gives the verdict
(higher is better: pass when the lower bound ≥ −margin, fail when the upper bound < −margin,
warn between, insufficient below min_items paired items).

Pairing is by item id over the items scored on BOTH pools: an item only one side has scored
(a run still going, a row lost) says nothing about the difference, so it is counted
(candidate_only / primary_only) but left out. Items are sorted by id before any bootstrap, so
the same rows give the same numbers in any order, on any machine (the seed is fixed).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from fleetctl.inference import confidence

# The bootstrap's seed: fixed, so a run's statistics never change when computed again.
SEED = 20261202

# Evidence verdict for a run verdict: "insufficient" is evidence of nothing yet (as shadow).
EVIDENCE_VERDICT = {"pass": "pass", "warn": "warn", "fail": "fail", "insufficient": "info"}


def verdict_for_evidence(verdict: str) -> str:
    """The Evidence verdict for a run verdict ("insufficient" -> "info")."""
    return EVIDENCE_VERDICT.get(verdict, "info")


def _pts(value: float) -> str:
    """A difference in points, signed, with a real minus sign."""
    return f"{value * 100:+.1f}".replace("-", "\u2212")


def _pct(value: float) -> str:
    return f"{value * 100:.1f} %"


def _is_binary(values: Sequence[float]) -> bool:
    return all(v in (0.0, 1.0) for v in values)


def pool_score(values: Sequence[float], *, level: float) -> dict[str, Any]:
    """{"n", "score", "lower", "upper", "method"} for one pool's scores (None figures when
    nothing is scored yet): Wilson when every score is 0/1, else BCa bootstrap of the mean."""
    n = len(values)
    if n == 0:
        return {"n": 0, "score": None, "lower": None, "upper": None, "method": None}
    if _is_binary(values):
        iv = confidence.wilson_interval(int(sum(values)), n, level)
    else:
        iv = confidence.bootstrap_mean_interval(values, level, seed=SEED)
    return {"n": n, "score": iv.estimate, "lower": iv.lower, "upper": iv.upper,
            "method": iv.method}


def paired(candidate: Sequence[float], primary: Sequence[float], *, margin: float,
           level: float, min_items: int) -> dict[str, Any]:
    """Candidate − primary over paired scores (item i of each list is one item): the interval
    (confidence.paired_difference), its test and the verdict (confidence.judge, higher is
    better). With no pairs the figures are None and the verdict insufficient."""
    n = len(candidate)
    if n == 0:
        return {"n": 0, "estimate": None, "lower": None, "upper": None, "p_value": None,
                "method": None, "test": None, "verdict": "insufficient",
                "explanation": (f"No item is scored on both pools yet; at least {min_items} "
                                f"are needed to judge.")}
    iv = confidence.paired_difference(candidate, primary, confidence=level, seed=SEED)
    judged = confidence.judge(iv, margin, n=n, min_n=min_items,
                              direction="higher_is_better")
    return {"n": n, "estimate": iv.estimate, "lower": iv.lower, "upper": iv.upper,
            "p_value": iv.p_value, "method": iv.method, "test": iv.test,
            "verdict": judged.verdict, "explanation": judged.explanation}


def _collect(rows: Iterable[Mapping[str, Any]]) -> tuple[
        dict[str, dict[str, float]], dict[str, set[str]], list[str]]:
    """pool -> item -> score (scored rows only), item -> tags, and the pools in first-seen
    order (a pool with no scored row still appears). A repeated (pool, item) row replaces the
    earlier one (the database holds one per pair)."""
    scores: dict[str, dict[str, float]] = {}
    tags: dict[str, set[str]] = {}
    order: list[str] = []
    for row in rows:
        pool, item = str(row["pool"]), str(row["item"])
        if pool not in scores:
            scores[pool] = {}
            order.append(pool)
        tags.setdefault(item, set()).update(str(t) for t in (row.get("tags") or ()))
        score = row.get("score")
        if score is None:
            scores[pool].pop(item, None)
        else:
            scores[pool][item] = float(score)
    return scores, tags, order


def _pairs(cand: Mapping[str, float], prim: Mapping[str, float],
           items: Iterable[str]) -> tuple[list[float], list[float]]:
    both = sorted(i for i in items if i in cand and i in prim)
    return [cand[i] for i in both], [prim[i] for i in both]


def _summary(verdict: str, *, candidate: str, primary: str | None,
             pools: Mapping[str, Mapping[str, Any]], pair: Mapping[str, Any] | None,
             margin: float, level: float, min_items: int, regressed: Sequence[str]) -> str:
    """One plain line: what was measured, the verdict and why."""

    def score(name: str) -> str:
        p = pools[name]
        if not p["n"]:
            return f"{name} nothing scored"
        return f"{name} {_pct(p['score'])} [{_pct(p['lower'])}, {_pct(p['upper'])}]"

    margin_text = f"margin {margin * 100:g} pts, {level * 100:g} % confidence"
    if primary is None or pair is None:
        return (f"insufficient: no primary to compare with ({score(candidate)} on "
                f"{pools[candidate]['n']} items); name a primary pool to get a verdict")
    if pair["n"] == 0:
        return (f"insufficient: no item scored on both {candidate} and {primary} yet "
                f"(need {min_items})")
    head = (f"{candidate} \u2212 {primary} {_pts(pair['estimate'])} pts "
            f"[{_pts(pair['lower'])}, {_pts(pair['upper'])}] over {pair['n']} items "
            f"({score(candidate)}; {score(primary)})")
    if verdict == "insufficient":
        tail = f"only {pair['n']} items scored on both; at least {min_items} are needed"
    elif verdict == "pass":
        tail = "the lower bound is within the margin"
    elif verdict == "fail":
        tail = "the whole interval is below the margin"
    else:
        tail = "the interval crosses the margin; more items would settle it"
    line = f"{verdict}: {head}; {tail} ({margin_text})"
    if regressed:
        shown = ", ".join(regressed[:5]) + (f" and {len(regressed) - 5} more"
                                            if len(regressed) > 5 else "")
        line += f"; regressed tags: {shown}"
    return line


def _tag_breakdown(item_tags: Mapping[str, set[str]], scores: Mapping[str, dict[str, float]],
                   order: Sequence[str], candidate: str, primary: str | None, *,
                   margin: float, level: float) -> tuple[dict[str, Any], list[str]]:
    """Per tag: each pool's score, the paired difference (no verdict: the run's verdict is
    the gate) and whether it regressed (its upper bound is below −margin); and the
    regressed tags, in order."""
    by_tag: dict[str, list[str]] = {}
    for item in sorted(item_tags):
        for tag in item_tags[item]:
            by_tag.setdefault(tag, []).append(item)
    cand = scores[candidate]
    prim = scores[primary] if primary is not None else None
    tags: dict[str, Any] = {}
    regressed: list[str] = []
    for tag in sorted(by_tag):
        items = by_tag[tag]
        tag_pools = {name: pool_score([scores[name][i] for i in items if i in scores[name]],
                                      level=level)
                     for name in order}
        tag_pair: dict[str, Any] | None = None
        flagged = False
        if prim is not None:
            a, b = _pairs(cand, prim, items)
            tag_pair = paired(a, b, margin=margin, level=level, min_items=1)
            tag_pair.pop("verdict")
            tag_pair.pop("explanation")
            flagged = tag_pair["upper"] is not None and tag_pair["upper"] < -margin
            if flagged:
                regressed.append(tag)
        tags[tag] = {"n": len(items), "pools": tag_pools, "paired": tag_pair,
                     "regressed": flagged}
    return tags, regressed


def run_statistics(rows: Iterable[Mapping[str, Any]], *, candidate: str, primary: str | None,
                   margin: float, confidence: float, min_items: int,
                   breakdown: bool = True) -> dict[str, Any]:
    """The run's statistics, JSON-ready (EvalRun.stats, the evidence's data, the run page).

    rows: {"pool": name, "item": item_id, "score": float | None, "tags": [...]}; a None score
    is an item not scored (yet) on that pool. Returns
    {"pools": {name: {"n", "score", "lower", "upper", "method"}},
     "paired": {"n", "estimate", "lower", "upper", "p_value", "method", "test",
                "candidate_only", "primary_only", "verdict", "explanation"} | None,
     "tags": {tag: {"n", "pools": {name: {...}}, "paired": {...} | None, "regressed": bool}},
     "regressed_tags": [tag, ...], "explanation": confidence.judge's sentence,
     "verdict": "pass" | "warn" | "fail" | "insufficient", "summary": "one line"}.
    A tag has no verdict of its own (many tags, few items each: the run's verdict is the
    gate); it is flagged "regressed" when its paired upper bound is below −margin.
    breakdown=False leaves the tags out (empty), for callers that only need the verdict
    (the power benchmark judges thousands of simulated runs)."""
    scores, item_tags, order = _collect(rows)
    for name in (candidate, primary):
        if name is not None and name not in scores:
            scores[name] = {}
            order.append(name)
    pools = {name: pool_score([scores[name][i] for i in sorted(scores[name])],
                              level=confidence)
             for name in order}
    cand = scores[candidate]
    prim = scores[primary] if primary is not None else None

    pair: dict[str, Any] | None = None
    if prim is not None:
        a, b = _pairs(cand, prim, cand.keys())
        pair = paired(a, b, margin=margin, level=confidence, min_items=min_items)
        pair["candidate_only"] = sum(1 for i in cand if i not in prim)
        pair["primary_only"] = sum(1 for i in prim if i not in cand)

    tags, regressed = (_tag_breakdown(item_tags, scores, order, candidate, primary,
                                      margin=margin, level=confidence)
                       if breakdown else ({}, []))
    verdict = pair["verdict"] if pair is not None else "insufficient"
    if pair is None:
        explanation = "No primary pool: nothing to compare the candidate with."
    else:
        explanation = pair["explanation"]
    return {"pools": pools, "paired": pair, "tags": tags, "regressed_tags": regressed,
            "verdict": verdict, "explanation": explanation,
            "summary": _summary(verdict, candidate=candidate, primary=primary, pools=pools,
                                pair=pair, margin=margin, level=confidence,
                                min_items=min_items, regressed=regressed)}
