"""How often does an eval run catch a 3-point quality drop, and how often does it fail a
candidate that is as good as its primary? Measured against the simulator, in-process.

For every bundled suite (fleetctl.evals.bundled, parsed by fleetctl.evals.suites like an
upload), each trial answers every item as a simulated pool would (fleetctl.sim.tasks.task_text,
the text the simulator's server sends) and scores it with the item's scorer
(fleetctl.evals.scorers.score), for three pools built from the real built-in profiles:

- the primary: h200 at task accuracy 0.92;
- an A/A candidate: mi300x at the same accuracy (its own divergence: on its share of keys it
  draws right or wrong independently of the primary, so the two disagree both ways);
- a dropped candidate: mi300x at 0.89 (3 points lower).

Each trial sends every item with another decoding seed, so every (model, prompt, seed) key is
new: an independent realisation of the same pools, as re-running the suite with another seed
would be. Each run is then judged exactly as a finished eval run is (fleetctl.evals.stats.
run_statistics: paired candidate − primary, Newcombe + exact McNemar, verdict against the
margin with min_items), per suite.

A family suite holds the same items (same prompts) as its part of fleetctl-core, so a prompt
is answered and scored once per trial and every suite that holds it reads that score: the
same answers the simulator would give each suite's own run.

Reported per suite: the rate a 3-point drop is caught (verdict not pass: a lead must justify
approving it; target >= 90 %) and the rate it fails outright; the rate an A/A run fails
(target <= 5 %) and warns; the medians of the estimate and interval, each pool's median score,
and how often the interval covers the true difference. Asserts nothing. Usage:

    .venv/bin/python benchmarks/eval_power.py [--trials 500] [--margin 0.02]
        [--confidence 0.95] [--drop 0.03] [--jobs 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import statistics
import sys
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetctl.evals import bundled, scorers, stats, suites  # noqa: E402
from fleetctl.sim import tasks  # noqa: E402
from fleetctl.sim.profiles import BUILTIN_PROFILES, Profile  # noqa: E402

CAUGHT_TARGET = 0.90
FALSE_FAIL_TARGET = 0.05
MODEL = "llama-3.1-8b-instruct"
SIDES = ("primary", "aa", "drop")  # the three simulated pools, in the score array's order

# Set once per worker process (ProcessPoolExecutor initializer).
_ITEMS: list[suites.SuiteItem] = []
_PROFILES: dict[str, Profile] = {}


def _prompt_key(item: suites.SuiteItem) -> str:
    """What the simulator keys an answer on besides the seed: the messages or the prompt."""
    if item.messages is not None:
        return json.dumps(item.messages, sort_keys=True)
    return item.prompt


def load_suites(names: list[str] | None = None
                ) -> tuple[list[suites.SuiteItem], dict[str, dict[str, Any]]]:
    """Every bundled suite parsed as an upload would be; the distinct prompts across them, and
    per suite the index of each of its items among those, with their ids and tags."""
    unique: dict[str, int] = {}
    items: list[suites.SuiteItem] = []
    per_suite: dict[str, dict[str, Any]] = {}
    for name in names or list(bundled.SUITES):
        parsed = suites.parse_suite(bundled.suite_lines(name))
        index, ids, tags = [], [], []
        for item in parsed.items:
            key = _prompt_key(item)
            if key not in unique:
                unique[key] = len(items)
                items.append(item)
            else:
                # The same prompt in two suites must be the same task, scored the same way.
                other = items[unique[key]]
                assert (other.scorer, other.references, other.params) == (
                    item.scorer, item.references, item.params), (name, item.item_id)
            if "seed" in item.request:
                raise SystemExit(f"{name} {item.item_id} pins its own seed: trials could not "
                                 f"vary it")
            index.append(unique[key])
            ids.append(item.item_id)
            tags.append(list(item.tags))
        per_suite[name] = {"index": np.array(index), "ids": ids, "tags": tags,
                           "n": len(parsed.items)}
    return items, per_suite


def _init(items: list[suites.SuiteItem], profiles: dict[str, Profile]) -> None:
    global _ITEMS, _PROFILES
    _ITEMS = items
    _PROFILES = profiles


def score_items(indices: list[int], seeds: list[int]) -> np.ndarray:
    """scores[item, trial, side] for the given distinct items, one seed per trial.

    Item by item (all trials of one item together), so a scorer's compiled JSON Schema is
    reused across the trials; an answer text seen before for the item reuses its score."""
    out = np.empty((len(indices), len(seeds), len(SIDES)))
    for row, i in enumerate(indices):
        item = _ITEMS[i]
        asked = item.messages if item.messages is not None else item.prompt
        seen: dict[str, float] = {}
        for col, seed in enumerate(seeds):
            for side_no, side in enumerate(SIDES):
                text = tasks.task_text(MODEL, asked, seed, _PROFILES[side])
                if text is None:
                    raise SystemExit(f"the simulator does not recognise item {item.item_id} "
                                     f"as a task: it would answer with free text")
                value = seen.get(text)
                if value is None:
                    value = scorers.score(item.scorer, text, item.references,
                                          item.params).value
                    seen[text] = value
                out[row, col, side_no] = value
    return out


def judge_trials(scores: np.ndarray, suite: dict[str, Any], *, margin: float,
                 confidence: float, min_items: int,
                 tag_trials: int) -> dict[str, list[dict[str, Any]]]:
    """Per scenario (aa, drop), one run_statistics summary per trial; the per-tag breakdown
    (which does not change the verdict and costs most of the time) for the first
    `tag_trials` trials only."""
    sub = scores  # [item, trial, side], the suite's items in its order
    results: dict[str, list[dict[str, Any]]] = {"aa": [], "drop": []}
    for trial in range(sub.shape[1]):
        primary = sub[:, trial, 0]
        for scenario, side in (("aa", 1), ("drop", 2)):
            candidate = sub[:, trial, side]
            rows = []
            for i, item_id in enumerate(suite["ids"]):
                rows.append({"pool": "primary", "item": item_id, "score": float(primary[i]),
                             "tags": suite["tags"][i]})
                rows.append({"pool": "candidate", "item": item_id,
                             "score": float(candidate[i]), "tags": suite["tags"][i]})
            out = stats.run_statistics(rows, candidate="candidate", primary="primary",
                                       margin=margin, confidence=confidence,
                                       min_items=min_items, breakdown=trial < tag_trials)
            paired = out["paired"]
            results[scenario].append({
                "verdict": out["verdict"], "estimate": paired["estimate"],
                "lower": paired["lower"], "upper": paired["upper"],
                "candidate": out["pools"]["candidate"]["score"],
                "primary": out["pools"]["primary"]["score"],
                "regressed_tags": (len(out["regressed_tags"]) if trial < tag_trials
                                   else None)})
    return results


def _judge_job(args: tuple[np.ndarray, dict[str, Any], float, float, int, int]
               ) -> dict[str, list[dict[str, Any]]]:
    scores, suite, margin, confidence, min_items, tag_trials = args
    return judge_trials(scores, suite, margin=margin, confidence=confidence,
                        min_items=min_items, tag_trials=tag_trials)


def summarise(trials: list[dict[str, Any]], truth: float) -> dict[str, Any]:
    verdicts = Counter(t["verdict"] for t in trials)
    flagged = [t["regressed_tags"] for t in trials if t["regressed_tags"] is not None]
    n = len(trials)
    return {
        "trials": n,
        "pass": verdicts["pass"] / n, "warn": verdicts["warn"] / n,
        "fail": verdicts["fail"] / n, "insufficient": verdicts["insufficient"] / n,
        "not_pass": 1 - verdicts["pass"] / n,
        "median_estimate": statistics.median(t["estimate"] for t in trials),
        "median_lower": statistics.median(t["lower"] for t in trials),
        "median_upper": statistics.median(t["upper"] for t in trials),
        "median_width": statistics.median(t["upper"] - t["lower"] for t in trials),
        "median_candidate": statistics.median(t["candidate"] for t in trials),
        "median_primary": statistics.median(t["primary"] for t in trials),
        "coverage": sum(t["lower"] <= truth <= t["upper"] for t in trials) / n,
        "runs_with_regressed_tags": (sum(f > 0 for f in flagged) / len(flagged)
                                     if flagged else None),
        "tag_trials": len(flagged),
    }


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:5.1f} %"


def _pts(value: float) -> str:
    return f"{value * 100:+.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--margin", type=float, default=0.02)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--min-items", type=int, default=100)
    parser.add_argument("--accuracy", type=float, default=0.92,
                        help="the primary's and the A/A candidate's task accuracy")
    parser.add_argument("--drop", type=float, default=0.03)
    parser.add_argument("--primary", default="h200", choices=sorted(BUILTIN_PROFILES))
    parser.add_argument("--candidate", default="mi300x", choices=sorted(BUILTIN_PROFILES))
    parser.add_argument("--seed", type=int, default=1_000_000,
                        help="the first trial's decoding seed (trial t uses seed + t)")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--tag-trials", type=int, default=100,
                        help="trials judged with the per-tag breakdown (the tag-flag rates)")
    parser.add_argument("--suites", nargs="+", choices=list(bundled.SUITES),
                        default=list(bundled.SUITES))
    parser.add_argument("--json", type=Path, help="write the figures here as JSON")
    args = parser.parse_args()

    started = time.perf_counter()
    profiles = {
        "primary": dataclasses.replace(BUILTIN_PROFILES[args.primary],
                                       task_accuracy=args.accuracy),
        "aa": dataclasses.replace(BUILTIN_PROFILES[args.candidate],
                                  task_accuracy=args.accuracy),
        "drop": dataclasses.replace(BUILTIN_PROFILES[args.candidate],
                                    task_accuracy=args.accuracy - args.drop),
    }
    items, per_suite = load_suites(args.suites)
    seeds = [args.seed + t for t in range(args.trials)]
    print(f"{len(per_suite)} suites, {len(items)} distinct items, {args.trials} trials; "
          f"primary {args.primary} at {args.accuracy:g}, candidate {args.candidate} at "
          f"{args.accuracy:g} (A/A) and {args.accuracy - args.drop:g} (drop); divergence "
          f"{profiles['primary'].divergence_rate:g} / {profiles['aa'].divergence_rate:g}; "
          f"margin {args.margin * 100:g} pts, {args.confidence * 100:g} %, min_items "
          f"{args.min_items}; {args.jobs} processes", flush=True)

    chunks = [list(range(len(items)))[k::args.jobs] for k in range(args.jobs)]
    scores = np.empty((len(items), len(seeds), len(SIDES)))
    with ProcessPoolExecutor(args.jobs, initializer=_init,
                             initargs=(items, profiles)) as pool:
        for chunk, part in zip(chunks, pool.map(score_items, chunks, [seeds] * args.jobs),
                               strict=True):
            scores[chunk] = part
        answered = time.perf_counter()
        print(f"answered and scored {scores.size:,} items in {answered - started:.0f} s",
              flush=True)
        jobs = [(scores[suite["index"]], suite, args.margin, args.confidence, args.min_items,
                 args.tag_trials)
                for suite in per_suite.values()]
        judged = dict(zip(per_suite, pool.map(_judge_job, jobs), strict=True))
    finished = time.perf_counter()
    print(f"judged {2 * args.trials * len(per_suite):,} runs in {finished - answered:.0f} s",
          flush=True)

    figures: dict[str, Any] = {}
    print()
    print(f"{'suite':<22}{'items':>6}  {'drop: caught':>12} {'fails':>8}  "
          f"{'A/A: fails':>10} {'warns':>8}  {'drop est [lo, hi]':>26}  "
          f"{'A/A est [lo, hi]':>24}")
    for name, suite in per_suite.items():
        drop = summarise(judged[name]["drop"], -args.drop)
        aa = summarise(judged[name]["aa"], 0.0)
        figures[name] = {"items": suite["n"], "drop": drop, "aa": aa}
        print(f"{name:<22}{suite['n']:>6}  {_pct(drop['not_pass']):>12} "
              f"{_pct(drop['fail']):>8}  {_pct(aa['fail']):>10} {_pct(aa['warn']):>8}  "
              f"{_pts(drop['median_estimate']):>8} [{_pts(drop['median_lower'])}, "
              f"{_pts(drop['median_upper'])}]  {_pts(aa['median_estimate']):>7} "
              f"[{_pts(aa['median_lower'])}, {_pts(aa['median_upper'])}]")
    print()
    print(f"{'suite':<22}  {'median scores: primary':>22} {'A/A cand':>9} {'drop cand':>9}"
          f"  {'coverage drop':>13} {'A/A':>7}  {'median width':>12}"
          f"  {'a tag flagged: drop':>19} {'A/A':>7}  (first {args.tag_trials} trials)")
    for name, f in figures.items():
        print(f"{name:<22}  {_pct(f['drop']['median_primary']):>22} "
              f"{_pct(f['aa']['median_candidate']):>9} "
              f"{_pct(f['drop']['median_candidate']):>9}  "
              f"{_pct(f['drop']['coverage']):>13} {_pct(f['aa']['coverage']):>7}  "
              f"{f['drop']['median_width'] * 100:>9.2f} pt  "
              f"{_pct(f['drop']['runs_with_regressed_tags']):>19} "
              f"{_pct(f['aa']['runs_with_regressed_tags']):>7}")
    print()
    core = figures.get(bundled.MIX)
    if core:
        ok_caught = core["drop"]["not_pass"] >= CAUGHT_TARGET
        ok_false = core["aa"]["fail"] <= FALSE_FAIL_TARGET
        print(f"{bundled.MIX}: a {args.drop * 100:g}-point drop caught in "
              f"{_pct(core['drop']['not_pass']).strip()} of {args.trials} trials (target "
              f">= {CAUGHT_TARGET:.0%}: {'met' if ok_caught else 'NOT met'}); A/A failed in "
              f"{_pct(core['aa']['fail']).strip()} (target <= {FALSE_FAIL_TARGET:.0%}: "
              f"{'met' if ok_false else 'NOT met'})")
    cpu = sum(getattr(resource.getrusage(who), field)
              for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
              for field in ("ru_utime", "ru_stime"))
    load = os.getloadavg()[0]
    print(f"total {finished - started:.0f} s on {args.jobs} processes, {cpu:.0f} CPU s "
          f"(load average {load:.1f} at the end, {os.cpu_count()} cores)")
    print("command: .venv/bin/python benchmarks/eval_power.py " + " ".join(sys.argv[1:]))
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                         "seconds": finished - started, "cpu_seconds": cpu,
                                         "figures": figures}, indent=2))


if __name__ == "__main__":
    main()
