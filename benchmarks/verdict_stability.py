"""Do shadow verdicts hold? The A/A false-fail rate under continuous looking, and verdict
flips per hour on a stream shaped like the demo's MI300X run — the old per-look fixed
interval against the confidence sequence the judge now uses (fleetctl/shadow/stats.py).

(a) A/A under continuous looking. --runs simulated A/A runs of --pairs pairs each, drawn from
    the simulator's replica-noise model (fleetctl/sim, `replica_noise`: primary, secondary
    and candidate — one more replica of the primary — each flip a greedy answer with
    probability r, the h200 profile's 1 %; no logprobs, so no flip is excused as a near-tie
    and every one counts on both sides: the harder case). Each run is judged after every new
    pair from min_pairs on, as a judge that looks all the time would, on the gated
    divergence: old = Newcombe's paired interval at 95 % judged afresh at each look (what
    stats.judge_pairs(sequential=False) computes; vectorised here, and checked against
    fleetctl.inference.confidence at a few looks), new = stats.sequence_path. Reported: the
    fraction of runs that ever reach fail (target ≤ 5 %), at margin 0 (any difference is a
    fail: where peeking bites) and at the plans' default 2 points, and the median number of
    verdict changes per run.

(b) Verdict flips per hour on the demo's MI300X. The demo's traffic (fleetctl/demo/traffic.py:
    the rotation of request bodies, greedy, logprobs on all but the JSON tenth) mirrored at
    the demo run's max_rps (3 pairs/s), each pair made in this process by the simulator's own
    text generator (fleetctl/sim/textgen.py TokenStream) for the demo's pools — the h200
    primary, its second replica, the mi300x candidate, each with its profile's divergence and
    replica noise — and compared with fleetctl.inference.compare as the shadow worker does.
    The judge looks every SHADOW_JUDGE_INTERVAL_S (15 s) for an hour: old = the judge as it
    was (the newest pair of each distinct request among the newest 20,000, a fixed interval
    per look), new = the judge now (the first pair of each distinct request, in order, the
    confidence sequence), both through stats.judge_pairs with the demo run's min_pairs 200
    and margin 2 points. Reported per simulated hour (--hours of them, each with its own
    noise draws and starting point in the rotation): verdict changes counted from the first
    judged verdict on, median and max (target ≤ 1 an hour for the new).

Prints figures and the seed; asserts nothing. One process, a few minutes:

    .venv/bin/python benchmarks/verdict_stability.py [--runs 1000] [--pairs 2000]
        [--hours 10] [--seed 20261207]
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetctl.inference import confidence  # noqa: E402
from fleetctl.inference.compare import (  # noqa: E402
    Answer,
    compare,
    requested_form,
    requested_greedy,
)
from fleetctl.shadow import stats  # noqa: E402

LEVEL = 0.95
MIN_PAIRS = 200
MARGIN = 0.02
TARGET_FALSE_FAIL = 0.05
TARGET_FLIPS = 1


# --- (a) A/A under continuous looking ---------------------------------------------------------

def aa_differences(rng: np.random.Generator, n: int, r: float) -> tuple[np.ndarray, np.ndarray]:
    """(signal, noise) 0/1 flags of n A/A pairs: noise = primary or secondary flipped,
    signal = primary or candidate flipped."""
    primary, secondary, candidate = (rng.random(n) < r for _ in range(3))
    return (primary | candidate).astype(np.int8), (primary | secondary).astype(np.int8)


def _wilson(x: np.ndarray, n: np.ndarray, z: float) -> tuple[np.ndarray, np.ndarray]:
    centre = (x + z * z / 2) / (n + z * z)
    half = z * np.sqrt(x * (n - x) / n + z * z / 4) / (n + z * z)
    return centre - half, centre + half


def newcombe_path(signal: np.ndarray, noise: np.ndarray, level: float
                  ) -> tuple[np.ndarray, np.ndarray]:
    """Newcombe's paired interval (method 10, as confidence.newcombe_paired_interval) for
    signal − noise after every pair: (lower, upper) per look."""
    n = np.arange(1, signal.size + 1, dtype=float)
    s, q = signal.astype(bool), noise.astype(bool)
    a = np.cumsum(s & q)
    b = np.cumsum(s & ~q)
    c = np.cumsum(~s & q)
    d = n - a - b - c
    z = float(NormalDist().inv_cdf(1 - (1 - level) / 2))
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = _wilson(a + b, n, z)
    l2, u2 = _wilson(a + c, n, z)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c
    with np.errstate(divide="ignore", invalid="ignore"):
        root = np.sqrt(margins)
        phi = np.where(margins > 0, np.where(cross > n / 2, (cross - n / 2) / root,
                                             np.where(cross < 0, cross / root, 0.0)), 0.0)
    diff = p1 - p2
    low_sq = (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2
    high_sq = (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2
    lower = np.maximum(-1.0, diff - np.sqrt(np.maximum(low_sq, 0.0)))
    upper = np.minimum(1.0, diff + np.sqrt(np.maximum(high_sq, 0.0)))
    return lower, upper


def _check_newcombe(rng: np.random.Generator) -> None:
    """The vectorised interval is confidence.newcombe_paired_interval's, at a few looks."""
    signal, noise = aa_differences(rng, 600, 0.05)
    lower, upper = newcombe_path(signal, noise, LEVEL)
    for k in (30, 199, 599):
        s, q = signal[:k + 1].astype(bool), noise[:k + 1].astype(bool)
        want = confidence.newcombe_paired_interval(
            int(np.sum(s & q)), int(np.sum(s & ~q)), int(np.sum(~s & q)),
            int(np.sum(~s & ~q)), LEVEL)
        assert abs(want[0] - lower[k]) < 1e-9 and abs(want[1] - upper[k]) < 1e-9, (k, want)


def _verdicts(lower: np.ndarray, upper: np.ndarray, margin: float) -> np.ndarray:
    """0 warn, 1 pass, 2 fail per look (lower is better)."""
    return np.where(lower > margin, 2, np.where(upper <= margin, 1, 0))


def _changes(verdicts: np.ndarray) -> int:
    return int(np.count_nonzero(verdicts[1:] != verdicts[:-1]))


def continuous_aa(*, runs: int, pairs: int, r: float, margins: tuple[float, ...],
                  seed: int) -> dict[float, dict[str, dict[str, float]]]:
    rng = np.random.default_rng(seed)
    found: dict[float, dict[str, dict[str, list[int]]]] = {
        m: {"old": {"fail": [], "changes": []}, "new": {"fail": [], "changes": []}}
        for m in margins}
    first = MIN_PAIRS - 1
    for _ in range(runs):
        signal, noise = aa_differences(rng, pairs, r)
        old_lower, old_upper = newcombe_path(signal, noise, LEVEL)
        path = stats.sequence_path(signal.astype(float) - noise, confidence=LEVEL,
                                   design_n=MIN_PAIRS, from_n=MIN_PAIRS)
        for margin in margins:
            for name, lower, upper in (("old", old_lower, old_upper),
                                       ("new", path.lower, path.upper)):
                verdicts = _verdicts(lower[first:], upper[first:], margin)
                found[margin][name]["fail"].append(int(np.any(verdicts == 2)))
                found[margin][name]["changes"].append(_changes(verdicts))
    return {m: {name: {"fail_rate": float(np.mean(v["fail"])),
                       "median_changes": float(np.median(v["changes"])),
                       "p90_changes": float(np.percentile(v["changes"], 90))}
                for name, v in by.items()} for m, by in found.items()}


# --- (b) the demo's MI300X, replayed ----------------------------------------------------------

class DemoPools:
    """The demo's three answers to one request (h200 primary, its second replica, the mi300x
    candidate), generated in this process by the simulator's own text generator with each
    profile's divergence and replica noise, as fleetctl/sim/server.py does for a greedy
    chat request; compared as the shadow worker compares (fleetctl/shadow/services/pairs.py)."""

    def __init__(self, rng: random.Random) -> None:
        from fleetctl.sim.profiles import BUILTIN_PROFILES

        self.rng = rng
        self.primary = BUILTIN_PROFILES["h200"]
        self.candidate = BUILTIN_PROFILES["mi300x"]
        self._answers: dict[tuple[int, str], Answer] = {}
        self._plain: dict[int, tuple[dict[str, int], dict[str, int]]] = {}

    def _answer(self, body: dict[str, Any], profile: Any, flip: float | None) -> Answer:
        """One pool's answer; `flip`: this request's replica-noise draw (None: no flip)."""
        from fleetctl.sim.api import parse_chat
        from fleetctl.sim.streams import structured_text
        from fleetctl.sim.textgen import TextKey, TokenStream

        req = parse_chat(dict(body))
        key = TextKey.of(req.model, req.prompt_text, req.seed)
        if req.json_format is not None:
            # Scripted JSON: the same on every pool, never flipped (sim/server.py).
            text = structured_text(req, key)
            return Answer.from_body({"choices": [{"message": {"role": "assistant",
                                                              "content": text},
                                                  "finish_reason": "stop"}]})
        stream = TokenStream(key=key, profile_name=profile.name,
                             divergence_rate=profile.divergence_rate,
                             near_tie_fraction=profile.near_tie_fraction,
                             temperature=0.0, top_logprobs=req.top_logprobs)
        max_tokens = int(req.max_tokens or 16)
        if flip is not None:
            stream.add_flip(flip, min(max_tokens, stream.natural_length))
        tokens: list[Any] = []
        while len(tokens) < max_tokens and len(tokens) < stream.natural_length:
            tokens.append(stream.next())
        finish = "length" if len(tokens) >= max_tokens else "stop"
        content = [{"token": t.text, "logprob": t.logprob,
                    "top_logprobs": [{"token": a, "logprob": lp} for a, lp in (t.top or [])]}
                   for t in tokens]
        choice: dict[str, Any] = {"message": {"role": "assistant",
                                              "content": "".join(t.text for t in tokens)},
                                  "finish_reason": finish}
        if req.top_logprobs is not None:
            choice["logprobs"] = {"content": content}
        return Answer.from_body({"choices": [choice]})

    def pair(self, request: int, body: dict[str, Any]
             ) -> tuple[dict[str, int], dict[str, int]]:
        """(noise, signal) metrics of one request. The noise draws are per request (not
        keyed); the answers without a flip are the same every time, so they are made once."""
        sides = (("primary", self.primary), ("secondary", self.primary),
                 ("candidate", self.candidate))
        flips = {name: (self.rng.random() if self.rng.random() < profile.replica_noise
                        else None) for name, profile in sides}
        if all(flip is None for flip in flips.values()) and request in self._plain:
            return self._plain[request]
        answers = {}
        for name, profile in sides:
            if flips[name] is None:
                cached = (request, profile.name)
                if cached not in self._answers:
                    self._answers[cached] = self._answer(body, profile, None)
                answers[name] = self._answers[cached]
            else:
                answers[name] = self._answer(body, profile, flips[name])
        greedy, options = requested_greedy(body), requested_form(body)
        out = (compare(answers["primary"], answers["secondary"], greedy=greedy,
                       **options).metrics(),
               compare(answers["primary"], answers["candidate"], greedy=greedy,
                       **options).metrics())
        if all(flip is None for flip in flips.values()):
            self._plain[request] = out
        return out


def demo_stream(pools: DemoPools, start: int, count: int, stream_every: int
                ) -> Iterator[tuple[int, tuple[dict[str, int], dict[str, int]]]]:
    """(distinct request index, pair) for `count` consecutive demo requests from `start`."""
    from fleetctl.demo.traffic import request_body

    for i in range(start, start + count):
        body = request_body(i, stream_every)
        body.pop("stream", None)
        body.pop("stream_options", None)
        request = _request_id(i)
        yield request, pools.pair(request, body)


def _request_id(i: int) -> int:
    """Which distinct request body the i-th of the rotation is (fleetctl/demo/traffic.py:
    prompt i mod 288, max_tokens i mod 5, JSON when i mod 10 = 3): i mod lcm(288, 5, 10)."""
    from fleetctl.demo.traffic import JSON_EVERY, MAX_TOKENS, PROMPTS

    return i % math.lcm(len(PROMPTS), len(MAX_TOKENS), JSON_EVERY)


def demo_hour(*, seed: int, rate: float, beat_s: float, seconds: float,
              window: int) -> dict[str, Any]:
    rng = random.Random(seed)
    pools = DemoPools(rng)
    start = rng.randrange(0, 1_000_000)
    total = int(rate * seconds)
    first_seen: list[tuple[dict[str, int], dict[str, int]]] = []
    seen: set[int] = set()
    newest: dict[int, tuple[dict[str, int], dict[str, int]]] = {}  # old: newest per request
    order: list[int] = []  # request ids, arrival order (old: the newest `window` pairs)
    verdicts: dict[str, list[str]] = {"old": [], "new": []}
    last: dict[str, stats.RunJudgement] = {}
    per_beat = rate * beat_s
    made = 0
    next_beat = per_beat
    for request, pair in demo_stream(pools, start, total, 1):
        made += 1
        if request not in seen:
            seen.add(request)
            first_seen.append(pair)
        newest[request] = pair
        order.append(request)
        if made >= next_beat:
            next_beat += per_beat
            recent = list(dict.fromkeys(reversed(order[-window:])))
            old = stats.judge_pairs([newest[r] for r in recent], margin=MARGIN,
                                    min_pairs=MIN_PAIRS, confidence=LEVEL, sequential=False)
            new = stats.judge_pairs(first_seen[:window], margin=MARGIN, min_pairs=MIN_PAIRS,
                                    confidence=LEVEL)
            verdicts["old"].append(old.verdict)
            verdicts["new"].append(new.verdict)
            last = {"old": old, "new": new}
    out: dict[str, Any] = {"distinct": len(seen), "pairs": made}
    for name, series in verdicts.items():
        judged = [v for v in series if v != "insufficient"]
        out[name] = {"flips": sum(1 for a, b in itertools.pairwise(judged) if a != b),
                     "final": series[-1], "summary": last[name].summary,
                     "shares": {v: judged.count(v) / max(1, len(judged))
                                for v in ("pass", "warn", "fail")}}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="A/A runs (part a)")
    parser.add_argument("--pairs", type=int, default=2000, help="pairs per A/A run")
    parser.add_argument("--hours", type=int, default=10, help="simulated demo hours (b)")
    parser.add_argument("--rate", type=float, default=3.0,
                        help="pairs per second (the demo run's max_rps)")
    parser.add_argument("--beat", type=float, default=15.0,
                        help="seconds between looks (SHADOW_JUDGE_INTERVAL_S)")
    parser.add_argument("--seed", type=int, default=20261207)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    _check_newcombe(np.random.default_rng(args.seed))
    r = 0.01  # the h200 profile's replica_noise (fleetctl/sim/profiles.py)
    print(f"verdict stability; confidence {LEVEL}, min_pairs {MIN_PAIRS}, seed {args.seed}")
    print(f"\n(a) A/A under continuous looking: {args.runs} runs x {args.pairs} pairs, "
          f"replica noise r = {r} per server, no logprobs (noise floor "
          f"{1 - (1 - r) ** 2:.2%}), judged after every pair from pair {MIN_PAIRS}")
    aa = continuous_aa(runs=args.runs, pairs=args.pairs, r=r, margins=(0.0, MARGIN),
                       seed=args.seed)
    for margin, by in aa.items():
        for name in ("old", "new"):
            f = by[name]
            ok = "" if name == "old" else (
                "  (target <= 5 %: met)" if f["fail_rate"] <= TARGET_FALSE_FAIL
                else "  (target <= 5 %: MISSED)")
            print(f"  margin {margin * 100:g} pts  {name:3}: ever fail {f['fail_rate']:6.1%}; "
                  f"verdict changes per run median {f['median_changes']:g}, "
                  f"p90 {f['p90_changes']:g}{ok}")
    print(f"  ({time.perf_counter() - started:.1f} s)")

    print(f"\n(b) the demo's MI300X (h200 primary + replica, mi300x candidate, the demo's "
          f"request rotation) at {args.rate:g} pairs/s, judged every {args.beat:g} s, "
          f"{args.hours} simulated hour(s), margin {MARGIN * 100:g} pts")
    flips: dict[str, list[int]] = {"old": [], "new": []}
    for hour in range(args.hours):
        t0 = time.perf_counter()
        out = demo_hour(seed=args.seed + hour, rate=args.rate, beat_s=args.beat,
                        seconds=3600.0, window=20_000)
        for name in ("old", "new"):
            flips[name].append(out[name]["flips"])
        shares = {name: ", ".join(f"{v} {s:.0%}" for v, s in out[name]["shares"].items()
                                  if s) for name in ("old", "new")}
        print(f"  hour {hour + 1}: {out['pairs']} pairs, {out['distinct']} distinct; "
              f"old {out['old']['flips']} flips ({shares['old']}), new {out['new']['flips']} "
              f"flips ({shares['new']}) [{time.perf_counter() - t0:.0f} s]")
        print(f"    old at the end: {out['old']['summary']}")
        print(f"    new at the end: {out['new']['summary']}")
    for name in ("old", "new"):
        values = flips[name]
        ok = "" if name == "old" else (
            "  (target <= 1: met)" if statistics.median(values) <= TARGET_FLIPS
            else "  (target <= 1: MISSED)")
        print(f"  {name}: verdict flips per hour median {statistics.median(values):g}, "
              f"max {max(values)}, mean {statistics.fmean(values):.2f}{ok}")
    print(f"\ntotal {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
