"""Scoring throughput per core on the bundled suites' real items and the simulator's answers.

benchmarks/scorer_throughput.py times each scorer on made-up answers; this times what an eval
worker actually scores: every item of the bundled suites (parsed and validated as an upload
is: params with their defaults, references as stored) against the text a simulated pool sends
back for it (`fleetctl.sim.tasks.task_text`, the same text the server streams: right for about
`task_accuracy` of the items, plausibly wrong for the rest), through the public
`scorers.score()`, as the runner calls it. The answers are computed first; only scoring is
timed. Every score gets its own copy of the item's params, as in a run, where every row reads
its item from the database. Two figures per suite:

  * `cold`: the validator cache emptied before each pass, so each distinct JSON Schema is
    checked and compiled once in the pass (what one run on a fresh worker pays);
  * `warm`: the cache kept from the pass before (a worker that has scored the suite already).
The process is pinned to one core (os.sched_setaffinity); each figure is the median of
`--runs` passes. The mean score printed beside each figure is the share the profile got
right (a check that the answers are the simulator's: about its task_accuracy).

    .venv/bin/python benchmarks/eval_scoring_throughput.py [--runs 5] [--profile mi300x]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetctl.evals import bundled  # noqa: E402
from fleetctl.evals.scorers import score  # noqa: E402
from fleetctl.evals.suites import SuiteItem, parse_suite  # noqa: E402
from fleetctl.inference import schema  # noqa: E402
from fleetctl.inference.compare import Answer  # noqa: E402
from fleetctl.sim.profiles import BUILTIN_PROFILES  # noqa: E402
from fleetctl.sim.tasks import task_text  # noqa: E402

MODEL = "llama-3.1-8b-instruct"


def answers(name: str, profile: str) -> list[tuple[SuiteItem, Answer]]:
    """Every item of bundled suite `name` with the answer a pool of `profile` gives it."""
    suite = parse_suite(bundled.suite_lines(name))
    out = []
    for item in suite.items:
        seed = {**suite.decoding, **item.request}.get("seed")
        asked: Any = item.messages if item.messages is not None else item.prompt
        text = task_text(MODEL, asked, seed, BUILTIN_PROFILES[profile])
        if text is None:
            raise SystemExit(f"{name}: the simulator does not recognise item {item.item_id}")
        out.append((item, Answer(text=text)))
    return out


def rate(batch: list[tuple[SuiteItem, Answer]], runs: int, *, cold: bool
         ) -> tuple[float, float]:
    """(scores per second, median of `runs` passes; mean score). Every score with its own
    deep copy of the params (made before the clock starts); `cold`: the validator cache
    emptied before each pass."""
    got = []
    mean = 0.0
    jobs = [(item.scorer, answer, item.references) for item, answer in batch]
    for _ in range(runs):
        params = [copy.deepcopy(item.params) for item, _ in batch]
        if cold:
            schema._VALIDATORS.clear()
            schema._BY_IDENTITY.clear()
        total = 0.0
        start = time.perf_counter()
        for (scorer, answer, references), item_params in zip(jobs, params, strict=True):
            total += score(scorer, answer, references, item_params).value
        got.append(len(batch) / (time.perf_counter() - start))
        mean = total / len(batch)
    return statistics.median(got), mean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", default="mi300x", choices=sorted(BUILTIN_PROFILES))
    args = parser.parse_args()
    pinned = "not pinned (no sched_setaffinity here)"
    if hasattr(os, "sched_setaffinity"):
        cpu = min(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpu})
        pinned = f"pinned to CPU {cpu}"
    print(f"$ {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(f"eval scoring throughput on one core ({pinned}): the bundled suites' items, the "
          f"simulated {args.profile} pool's answers (task_accuracy "
          f"{BUILTIN_PROFILES[args.profile].task_accuracy:g}), median of {args.runs} passes")
    print(f"{'suite':<22} {'items':>6} {'scorers':<38} {'cold/s':>9} {'warm/s':>9}  "
          f"mean score")
    names = [f"fleetctl-{family}" for family in bundled.FAMILIES] + [bundled.MIX]
    for name in names:
        batch = answers(name, args.profile)
        cold, mean = rate(batch, args.runs, cold=True)
        warm, _ = rate(batch, args.runs, cold=False)
        scorers = ", ".join(sorted({item.scorer for item, _ in batch}))
        print(f"{name:<22} {len(batch):>6} {scorers:<38} {cold:>9,.0f} {warm:>9,.0f}  "
              f"{mean:.3f}", flush=True)


if __name__ == "__main__":
    main()
