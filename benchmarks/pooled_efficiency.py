"""Pooled efficiency through the gateway (issue 28): how much of the pools' own SLO-qualified
throughput a route gets when one real Envoy splits its traffic between them, at equal
weights, at the route's current weights, and at capacity weights (the split in proportion to
each pool's SLO-qualified tokens/s: fleetctl/traffic/capacity.py `proportional_weights`,
the function the product's capacity split uses).

Two simulated pools of different speeds, each its own simulator process (fleetctl.sim):
`fast`, the built-in `h200` profile, and `slow`, the built-in `a100` profile, each with its
per-sequence decode cost raised (FAST_PER_SEQ_MS, SLOW_PER_SEQ_MS) so that the SLO binds at
a few streams this 2-core machine's client can drive (the built-in figures bind at hundreds).
One real Envoy (fleetctl/demo/envoy_process.py) carries one route of the model to both,
configured by the product's Envoy adapter; weights change by runtime update between phases.

First, each pool's own SLO throughput, once: the product's concurrency search
(fleetctl/bench/sweep.py `search`, to 1 stream) with the product's load generator
(fleetctl/bench/runner.py `run_level`) and verdict (fleetctl/bench/stats.py), straight at the
pool: its best passing level's output tokens/s. The capacity weights are these figures'
proportions. Then, each repeat, per split (equal, current, capacity): the same search through
the gateway, between 1 and the sum of the pools' own best streams (the most the pair can
carry), judged on all the route's requests together (the SLO a caller of the route sees);
pooled efficiency = the route's output tokens/s at its best passing level / (fast's own +
slow's own). Prints each repeat, then per split the median over repeats, and the ratio
capacity / equal of those medians.

SLO: TTFT p95 <= 1,500 ms, TPOT p95 <= 50 ms, errors <= 1 %. A level is warm-up then a short
window (see LevelPlan below); a level the client could not drive (lag or CPU) is "invalid"
and bounds the search like a fail (the sweep module's rule).

    .venv/bin/python benchmarks/pooled_efficiency.py [--quick] [--repeats 3]
        [--current fast=90,slow=10]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
from benchmarks._sim import start_simulator  # noqa: E402

MODEL = "llama-3.1-8b-instruct"
ROUTE = "pooled"
FAST_PER_SEQ_MS = 1.0  # h200: TPOT ~ 10 + 1.0 x streams ms: ~35-40 streams at 50 ms
SLOW_PER_SEQ_MS = 2.0  # a100: TPOT ~ 18 + 2.0 x streams ms: ~12-16 streams at 50 ms
PROFILES = f"""
[profiles.fast]
base = "h200"
description = "simulated H200-class, per-sequence cost raised for a small client"
decode_per_seq_ms = {FAST_PER_SEQ_MS}
network_latency_ms = 0.0
replica_noise = 0.0

[profiles.slow]
base = "a100"
description = "simulated A100-class, per-sequence cost raised for a small client"
decode_per_seq_ms = {SLOW_PER_SEQ_MS}
network_latency_ms = 0.0
replica_noise = 0.0
"""
SLO_TTFT_S, SLO_TPOT_S, SLO_ERRORS = 1.5, 0.050, 0.01
RESOLUTION = 1
LAG_LIMIT_S = 0.025  # the product's default lag limit for a run (Run.lag_limit_ms)
MAX_STREAMS_OWN = 64


@dataclass(frozen=True)
class Row:
    """A trace row (fleetctl.bench.client.TraceRequestLike): synthetic prompt words."""

    prompt_tokens: int
    completion_tokens: int
    arrival_s: float = 0.0
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    prefix_group: str | None = None
    prefix_tokens: int = 0
    latency_class: str | None = None


TRACE = [Row(200, 24), Row(400, 32), Row(120, 20), Row(300, 28)]


@dataclass
class Found:
    streams: int | None
    tokens_per_s: float
    levels: list[tuple[int, str]]  # each level measured and its verdict (why, when not a pass)


def start_pool(folder: Path, name: str) -> tuple[subprocess.Popen[str], str]:
    """One simulator process serving pool `name` (profile `name`) on a free port."""
    return start_simulator(folder / "profiles.toml", "--pool", f"{name}={name}@0",
                           "--model", MODEL)


def plan() -> Any:
    from fleetctl.bench.runner import LevelPlan

    return LevelPlan(warmup_s=2.0, window_s=3.0, min_samples=40, max_duration_s=30.0,
                     request_timeout_s=30.0, ramp_s=1.0)


async def best_level(url: str, level_plan: Any, max_streams: int, start: int) -> Found:
    """The product's concurrency search at `url`: the highest level meeting the SLO."""
    from fleetctl.bench import stats
    from fleetctl.bench.runner import Endpoint, run_level
    from fleetctl.bench.sweep import search

    slo = stats.Slo(ttft_p95_s=SLO_TTFT_S, tpot_p95_s=SLO_TPOT_S, error_rate=SLO_ERRORS)
    tokens: dict[int, float] = {}

    async def measure(concurrency: int) -> stats.Verdict:
        level = await run_level(Endpoint(url, MODEL), TRACE, level_plan,
                                concurrency=concurrency)
        summary = stats.summarize(level.samples())
        tokens[concurrency] = summary.output_tokens_per_s
        return stats.verdict(summary, slo, min_samples=level_plan.min_samples,
                             lag_limit_s=LAG_LIMIT_S)

    result = await search(measure, max_concurrency=max_streams, start=min(start, max_streams),
                          resolution=RESOLUTION, retest=False)
    best = result.best
    return Found(best, tokens.get(best, 0.0) if best else 0.0,
                 [(step.concurrency, step.verdict.outcome if step.verdict.outcome == "pass"
                   else f"{step.verdict.outcome}: {step.verdict.binding} "
                        f"{step.verdict.ratio or 0:.2f}x") for step in result.steps])


def apply_split(adapter: Any, pools: dict[str, Any], weights: dict[str, int],
                revision: int) -> None:
    from fleetctl.traffic.gateways.base import DesiredState, RouteSpec

    adapter.apply(DesiredState(routes=(RouteSpec(
        key=ROUTE, model=MODEL, latency_class="", residency="", revision=revision,
        weights=weights),), pools=pools))


def parse_split(text: str) -> dict[str, int]:
    weights = {}
    for part in text.split(","):
        name, _, percent = part.partition("=")
        weights[name.strip()] = round(float(percent) * 100)
    if set(weights) != {"fast", "slow"} or sum(weights.values()) != 10_000:
        raise SystemExit("--current: fast=P,slow=Q adding up to 100")
    return weights


def show(weights: dict[str, int]) -> str:
    return "/".join(f"{weights.get(p, 0) / 100:g}" for p in ("fast", "slow"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one repeat")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--current", default="fast=90,slow=10",
                        help="the route's current split (default: a 10 %% canary)")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats

    import django

    django.setup()
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess
    from fleetctl.traffic.capacity import proportional_weights
    from fleetctl.traffic.gateways.base import PoolTarget
    from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter

    current = parse_split(args.current)
    folder = Path(tempfile.mkdtemp(prefix="bench-pooled-"))
    (folder / "profiles.toml").write_text(PROFILES)
    procs: list[subprocess.Popen[str]] = []
    envoy = EnvoyProcess(folder / "envoy", free_port(), free_port(), access_log=False)
    level_plan = plan()
    started = time.perf_counter()
    try:
        urls = {}
        for name in ("fast", "slow"):
            proc, urls[name] = start_pool(folder, name)
            procs.append(proc)
        envoy.start(timeout_s=60)
        adapter = EnvoyAdapter(envoy.gateway("bench", load_timeout_s=30))
        targets = {name: PoolTarget(name, (url,), "US") for name, url in urls.items()}
        gateway = f"http://127.0.0.1:{envoy.listen_port}"
        print(f"SLO: TTFT p95 <= {SLO_TTFT_S * 1000:g} ms, TPOT p95 <= {SLO_TPOT_S * 1000:g} "
              f"ms, errors <= {SLO_ERRORS:.0%}; levels: {level_plan.warmup_s:g} s warm-up, "
              f">= {level_plan.window_s:g} s window, >= {level_plan.min_samples} requests")
        own = {name: asyncio.run(best_level(url, level_plan, MAX_STREAMS_OWN, start=8))
               for name, url in urls.items()}
        total = sum(found.tokens_per_s for found in own.values())
        streams = sum(found.streams or 0 for found in own.values())
        for name, found in own.items():
            print(f"{name} alone: {found.tokens_per_s:,.0f} tok/s at {found.streams} streams "
                  f"(levels {found.levels})")
        if not total or not streams:
            raise SystemExit("a pool met the SLO at no level: nothing to compare")
        splits = {"equal": {"fast": 5000, "slow": 5000}, "current": current,
                  "capacity": proportional_weights(
                      {name: found.tokens_per_s for name, found in own.items()})}
        results: dict[str, list[float]] = {label: [] for label in splits}
        revision = 0
        for repeat in range(1, repeats + 1):
            for label, weights in splits.items():
                revision += 1
                apply_split(adapter, targets, weights, revision)
                route = asyncio.run(best_level(gateway, level_plan, streams,
                                               start=max(1, streams // 2)))
                efficiency = route.tokens_per_s / total
                results[label].append(efficiency)
                print(f"[{repeat}] route at {label} weights ({show(weights)}): "
                      f"{route.tokens_per_s:,.0f} tok/s at {route.streams} streams; pooled "
                      f"efficiency {efficiency:.1%} (levels {route.levels})")
        print(f"\npooled efficiency = route tokens/s at SLO / sum of the pools' own "
              f"(medians over {repeats} repeat(s)):")
        for label, values in results.items():
            print(f"  {label:<9} {statistics.median(values):.1%}  "
                  f"({', '.join(f'{v:.1%}' for v in values)})")
        equal = statistics.median(results["equal"])
        ratio = statistics.median(results["capacity"]) / equal if equal else float("nan")
        print(f"  capacity / equal: {ratio:.2f}×")
        print(f"wall time {time.perf_counter() - started:.0f} s")
    finally:
        envoy.stop()
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=10)


if __name__ == "__main__":
    main()
