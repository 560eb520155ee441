"""How many shadow pairs does the gate need, and how often does it fail a good candidate?

Simulates shadow runs pair by pair and judges each with the gate itself
(fleetctl.shadow.stats.judge_pairs: every gated metric, the near-tie rule, the verdict rules),
under the simulator's noise model (fleetctl/sim, `replica_noise`): per request, each of the
three servers — primary, secondary (another primary replica), candidate — independently flips
its greedy answer at one near-tie position with probability r (GPU batch nondeterminism), and
a regressed candidate also diverges for real (a hard flip) with probability d. The noise
comparison (primary vs secondary) diverges when either replica flipped; the signal (primary vs
candidate) when the primary flipped, the candidate flipped or the candidate diverged. The
primary's own flip is in both comparisons: the two are correlated, which the paired interval
uses. r is set so the noise floor is 1 % (1 − (1 − r)² = 0.01).

Near-ties are only visible when a request asks for logprobs; `--logprobs-share` is the share
that does (default 0: no flip can be excused as a near-tie, the harder case for the gate).

(a) Pairs needed to detect a 2-point divergence increase over a 1 % noise floor:
    confidence.samples_needed(0.01, 0.02) (one-sided α 0.05, power 0.8, independent-sample
    formula), and by simulation the smallest n at which ≥ 80 % of regressed runs fail —
    with margin 0 (the same question samples_needed answers) and with the plans' default
    margin of 2 points (a candidate 2 points beyond the margin, i.e. +4 points).
(b) False-fail rate of A/A runs (candidate = another primary replica) at the default
    confidence 0.95 and margin 2 points, over --runs runs at n = 1, 2, 3 and 4 × min_pairs
    (target ≤ 5 %), with the warn and pass rates (how many pairs a good candidate needs to
    pass rather than warn).

Prints figures and the seed; asserts nothing. Usage:

    .venv/bin/python benchmarks/shadow_gate_statistics.py [--runs 1000] [--power-runs 300]
        [--min-pairs 200] [--logprobs-share 0] [--seed 20261202]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetctl.inference import confidence  # noqa: E402
from fleetctl.shadow import stats  # noqa: E402

FLOOR = 0.01
RISE = 0.02
MARGIN = 0.02
POWER = 0.8
FALSE_FAIL_TARGET = 0.05
SAME = {"diverged": 0, "finish_mismatch": 0, "error_mismatch": 0, "refusal_mismatch": 0}


def replica_noise_for(floor: float) -> float:
    """r such that two replicas, each flipping with probability r, differ at `floor`."""
    return 1.0 - math.sqrt(1.0 - floor)


def _comparison(diverged: bool, near_tie_only: bool, logprobs: bool) -> dict[str, int]:
    if not diverged:
        return SAME
    out = {**SAME, "diverged": 1, "exact_match": 0}
    if logprobs:
        out["near_tie"] = int(near_tie_only)
        out["hard_flip"] = int(not near_tie_only)
    return out


def simulate_pairs(rng: np.random.Generator, n: int, *, r: float, d: float,
                   logprobs_share: float) -> list[tuple[dict[str, int], dict[str, int]]]:
    """n (noise metrics, signal metrics) pairs under the replica-noise model."""
    primary, secondary, candidate = (rng.random(n) < r for _ in range(3))
    diverges = rng.random(n) < d
    logprobs = rng.random(n) < logprobs_share
    pairs = []
    for i in range(n):
        noise = _comparison(bool(primary[i] or secondary[i]), True, bool(logprobs[i]))
        signal = _comparison(bool(primary[i] or candidate[i] or diverges[i]),
                             not diverges[i], bool(logprobs[i]))
        pairs.append((noise, signal))
    return pairs


def divergence_for(rise: float, r: float) -> float:
    """d such that the signal's divergence rate is the noise floor + `rise`."""
    floor = 1 - (1 - r) ** 2
    return 1 - (1 - (floor + rise)) / (1 - r) ** 2


def verdicts(*, n: int, runs: int, r: float, d: float, margin: float, min_pairs: int,
             logprobs_share: float, seed: int) -> Counter[str]:
    rng = np.random.default_rng(seed)
    found: Counter[str] = Counter()
    for _ in range(runs):
        pairs = simulate_pairs(rng, n, r=r, d=d, logprobs_share=logprobs_share)
        found[stats.judge_pairs(pairs, margin=margin, min_pairs=min_pairs,
                                confidence=confidence.DEFAULT_CONFIDENCE).verdict] += 1
    return found


def smallest_n(*, runs: int, r: float, d: float, margin: float, logprobs_share: float,
               seed: int, lo: int = 50, hi: int = 800, step: int = 25) -> tuple[int, float]:
    """The smallest n (a multiple of `step`) at which ≥ POWER of regressed runs fail."""

    def power(n: int) -> float:
        found = verdicts(n=n, runs=runs, r=r, d=d, margin=margin, min_pairs=10,
                         logprobs_share=logprobs_share, seed=seed + n)
        return found["fail"] / runs

    while power(hi) < POWER:
        lo, hi = hi, hi * 2
    while hi - lo > step:
        mid = (lo + hi) // 2 // step * step
        if power(mid) >= POWER:
            hi = mid
        else:
            lo = mid
    return hi, power(hi)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="A/A runs per n")
    parser.add_argument("--power-runs", type=int, default=300,
                        help="regressed runs per n tried in the power search")
    parser.add_argument("--min-pairs", type=int, default=200)
    parser.add_argument("--logprobs-share", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=20261202)
    args = parser.parse_args(argv)
    r = replica_noise_for(FLOOR)
    started = time.perf_counter()
    print(f"noise model: replica_noise r = {r:.5f} per server (noise floor {FLOOR:.0%}), "
          f"logprobs share {args.logprobs_share:g}, confidence "
          f"{confidence.DEFAULT_CONFIDENCE}, seed {args.seed}")

    print("\n(a) pairs needed to detect a 2-point divergence rise over a 1 % noise floor")
    needed = confidence.samples_needed(FLOOR, RISE)
    print(f"  confidence.samples_needed(0.01, 0.02) = {needed} pairs "
          f"(one-sided alpha 0.05, power 0.8)")
    rows: list[tuple[str, float, float]] = [("margin 0, +2 pts", 0.0, RISE),
                                            ("margin 2 pts, +4 pts (2 beyond it)", MARGIN,
                                             MARGIN + RISE)]
    for label, margin, rise in rows:
        d = divergence_for(rise, r)
        n, power = smallest_n(runs=args.power_runs, r=r, d=d, margin=margin,
                              logprobs_share=args.logprobs_share, seed=args.seed)
        print(f"  simulated, {label}: candidate divergence d = {d:.4f}; smallest n with "
              f">= {POWER:.0%} of {args.power_runs} runs failing: {n} pairs "
              f"({power:.1%} fail)")

    print(f"\n(b) A/A false-fail rate at margin {MARGIN * 100:g} pts, min_pairs "
          f"{args.min_pairs}, {args.runs} runs each")
    result: dict[str, Any] = {}
    for n in (args.min_pairs, 2 * args.min_pairs, 3 * args.min_pairs, 4 * args.min_pairs):
        found = verdicts(n=n, runs=args.runs, r=r, d=0.0, margin=MARGIN,
                         min_pairs=args.min_pairs, logprobs_share=args.logprobs_share,
                         seed=args.seed + 7 * n)
        shares = {v: found[v] / args.runs for v in ("fail", "warn", "pass", "insufficient")}
        result[n] = shares
        upper = _wilson_upper(found["fail"], args.runs)
        print(f"  n = {n}: fail {shares['fail']:.1%} (95 % upper bound {upper:.1%}; target "
              f"<= {FALSE_FAIL_TARGET:.0%}), warn {shares['warn']:.1%}, "
              f"pass {shares['pass']:.1%}")
    print(f"\nelapsed {time.perf_counter() - started:.0f} s")
    return 0


def _wilson_upper(k: int, n: int) -> float:
    return confidence.wilson_interval(k, n).upper


if __name__ == "__main__":
    raise SystemExit(main())
