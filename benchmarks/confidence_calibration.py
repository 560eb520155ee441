"""How often does a confidence gate fail or warn a candidate that is as good as the reference?

Simulates many A/A shadow runs: per request, the primary-vs-secondary comparison diverges at
the noise floor (1 %), and the candidate-vs-primary comparison diverges at the same rate. Each
run is judged like a shadow gate — `paired_difference` (Newcombe paired interval, exact
McNemar) then `judge(..., direction="lower_is_better")` against a margin — and the script
reports the false-fail rate (target ≤ 5 %), the false-warn rate, the coverage of the interval,
and the power to catch a candidate that diverges two points more than the floor. It does the
same, with fewer runs, for paired eval scores in [0, 1] (BCa paired bootstrap,
higher_is_better) and prints `samples_needed` for the same rise.

Prints figures and the seeds; asserts nothing. Usage:

    .venv/bin/python benchmarks/confidence_calibration.py [--runs 2000] [--margin 0.01]
        [--bootstrap-runs 200] [--seed 20261202]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetctl.inference import confidence as conf  # noqa: E402

FALSE_FAIL_TARGET = 0.05


def divergence_runs(*, n: int, floor: float, rise: float, margin: float, runs: int,
                    seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    verdicts: Counter[str] = Counter()
    covered = 0
    widths, uppers = [], []
    for _ in range(runs):
        noise = (rng.random(n) < floor).astype(int)
        candidate = (rng.random(n) < floor + rise).astype(int)
        iv = conf.paired_difference(candidate, noise)
        verdicts[conf.judge(iv, margin, min_n=100, direction="lower_is_better").verdict] += 1
        covered += iv.lower <= rise <= iv.upper
        widths.append(iv.upper - iv.lower)
        uppers.append(iv.upper)
    return {"fail": verdicts["fail"] / runs, "warn": verdicts["warn"] / runs,
            "pass": verdicts["pass"] / runs, "coverage": covered / runs,
            "median_width": statistics.median(widths), "median_upper": statistics.median(uppers)}


def _scores(rng: np.random.Generator, n: int, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """Scores of one side with `shift`, and the item difficulty they were drawn around."""
    difficulty = rng.beta(2.0, 2.0, n)
    return np.clip(difficulty + shift + rng.normal(0.0, 0.1, n), 0.0, 1.0), difficulty


def score_runs(*, n: int, shift: float, margin: float, runs: int, seed: int) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    # The population difference (clipping to [0, 1] moves it off `shift`), from one big draw.
    true_diff = float(np.mean(_scores(rng, 1_000_000, shift)[0]
                              - _scores(rng, 1_000_000, 0.0)[0]))
    verdicts: Counter[str] = Counter()
    covered = 0
    for run in range(runs):
        # Item difficulty shared by both sides; each side scores it with its own noise.
        difficulty = rng.beta(2.0, 2.0, n)
        reference = np.clip(difficulty + rng.normal(0.0, 0.1, n), 0.0, 1.0)
        candidate = np.clip(difficulty + shift + rng.normal(0.0, 0.1, n), 0.0, 1.0)
        iv = conf.paired_difference(candidate, reference, seed=run)
        verdicts[conf.judge(iv, margin, min_n=100).verdict] += 1
        covered += iv.lower <= true_diff <= iv.upper
    return {"fail": verdicts["fail"] / runs, "warn": verdicts["warn"] / runs,
            "pass": verdicts["pass"] / runs, "coverage": covered / runs,
            "true_diff": true_diff}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--bootstrap-runs", type=int, default=200)
    parser.add_argument("--floor", type=float, default=0.01)
    parser.add_argument("--margin", type=float, default=0.01)
    parser.add_argument("--rise", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=20261202)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.bootstrap_runs < 0 or not 0 < args.floor < 1 or args.margin < 0:
        parser.error("runs ≥ 1, bootstrap-runs ≥ 0, 0 < floor < 1 and margin ≥ 0")

    print(f"confidence {conf.DEFAULT_CONFIDENCE} (two-sided), noise floor {args.floor:.1%}, "
          f"margin {args.margin * 100:.1f} pts, {args.runs} runs per row, seed {args.seed}")
    print("shadow divergence, paired 0/1, lower_is_better (Newcombe paired + exact McNemar)")
    header = (f"{'pairs':>6} {'true diff':>9} {'fail':>7} {'warn':>7} {'pass':>7} "
              f"{'coverage':>8} {'med width':>9} {'med upper':>9} {'seed':>9}")
    print(header)
    for n in (1000, 5000):
        for rise in (0.0, args.rise):
            seed = args.seed + n + int(rise * 1000)
            started = time.perf_counter()
            r = divergence_runs(n=n, floor=args.floor, rise=rise, margin=args.margin,
                                runs=args.runs, seed=seed)
            took = time.perf_counter() - started
            label = "A/A" if rise == 0 else f"+{rise * 100:.0f} pts"
            flag = ""
            if rise == 0:
                flag = "  false-fail OK" if r["fail"] <= FALSE_FAIL_TARGET else "  ABOVE TARGET"
            else:
                flag = f"  power (fail) {r['fail']:.1%}, not passed {1 - r['pass']:.1%}"
            print(f"{n:>6} {label:>9} {r['fail']:>7.2%} {r['warn']:>7.2%} {r['pass']:>7.2%} "
                  f"{r['coverage']:>8.2%} {r['median_width'] * 100:>6.2f} pt "
                  f"{r['median_upper'] * 100:>+6.2f} pt {seed:>9}{flag}  "
                  f"({took / args.runs * 1000:.2f} ms/run)")
    needed = conf.samples_needed(args.floor, args.rise)
    print(f"samples_needed({args.floor}, {args.rise}) = {needed} pairs "
          f"(one-sided alpha 0.05, power 0.8)")

    if args.bootstrap_runs:
        print(f"\neval scores in [0, 1], paired, higher_is_better (BCa paired bootstrap, "
              f"{conf.DEFAULT_RESAMPLES} resamples), margin 2 pts, "
              f"{args.bootstrap_runs} runs per row")
        print(f"{'items':>6} {'shift':>9} {'true diff':>9} {'fail':>7} {'warn':>7} {'pass':>7} "
              f"{'coverage':>8} {'seed':>9}")
        for n in (200, 1000):
            for shift in (0.0, -0.05):
                seed = args.seed + 7 * n + int(-shift * 1000)
                started = time.perf_counter()
                r = score_runs(n=n, shift=shift, margin=0.02, runs=args.bootstrap_runs,
                               seed=seed)
                took = time.perf_counter() - started
                label = "A/A" if shift == 0 else f"{shift * 100:+.0f} pts"
                print(f"{n:>6} {label:>9} {r['true_diff'] * 100:>+6.2f} pt "
                      f"{r['fail']:>7.2%} {r['warn']:>7.2%} "
                      f"{r['pass']:>7.2%} {r['coverage']:>8.2%} {seed:>9}  "
                      f"({took / args.bootstrap_runs * 1000:.1f} ms/run)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
