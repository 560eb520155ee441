"""Prefix affinity against today's least-request balancing (issue 28), through a real Envoy in
front of one simulated pool of N endpoints, each with its own prefix cache.

The shared-prefix workload: every prompt is ~7.2k tokens, `--shared` of them the prefix of
one of `--groups` groups (a long system prompt or document), the rest its own; `--output`
tokens out (the issue's ~1k is scaled down to 256 by default so a run fits two shared cores;
give `--output 1024` for the full size). The benchmark runner (fleetctl.bench.runner) drives
it at fixed concurrency, streaming, through the gateway; each arm gets fresh prefix words, so
no arm finds another's prefixes cached.

Arms, one after another in each round (rounds interleave them, so load on the shared machine
falls on all alike):

- `least-request`: the route without affinity, the pool's cluster LEAST_REQUEST (today);
- `affinity`: the route with prompt affinity (the leading `--prefix-bytes` of the prompt),
  the cluster ring hash with bounded load (150 %);
- `hashed-no-key`: another route of the same pool without affinity while an affinity route
  also lists it: its requests carry no key, so the ring hash picks at random under the
  bound (what a non-affinity route sharing a pool gets instead of least-request).

Per arm: the prefix-cache hit rate (hits / queries of the endpoints' /metrics counters over
the arm), TTFT p50 and p95, output tokens/s and requests/s in the window. Printed per round,
then the medians over rounds and the ratios to least-request.

`--only cost`: what the key costs a request at the gateway. One Envoy, two one-endpoint
pools of a simulator whose prefill is near free; the same ~7.2k-token chat (max_tokens 1,
always a cache hit) alternates, one by one, between a route with affinity (the Lua script
hashes `--prefix-bytes`, ring hash picks) and one without (least-request): client-side p50
and p99 per round, and what affinity adds.

    .venv/bin/python benchmarks/prefix_affinity.py [--endpoints 4] [--groups 32]
        [--concurrency 16] [--rounds 3] [--output 256] [--warmup 10] [--window 30]
        [--only arms|cost] [--requests 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")

MODEL = "llama-3.1-8b-instruct"
OTHER = "qwen2.5-7b-instruct"  # the hashed-no-key arm's route
# An H200-class endpoint (the built-in's prefill 30,000 tokens/s and 150,000-token prefix
# cache), with decode steps of 5 ms and no noise, so the arms differ only by where requests go.
PROFILES = """
[profiles.bench]
base = "h200"
decode_base_ms = 5.0
decode_per_seq_ms = 0.05
network_latency_ms = 0.0
divergence_rate = 0.0
replica_noise = 0.0
"""
ARMS = ("least-request", "affinity", "hashed-no-key")
# For --only cost: prefill near free, so a request's time is the gateway's and the client's.
COST_PROFILES = """
[profiles.free]
base = "h200"
decode_base_ms = 0.5
decode_per_seq_ms = 0.0
network_latency_ms = 0.0
replica_noise = 0.0
prefill_tokens_per_s = 10000000.0
"""


def start_simulator(folder: Path, endpoints: int, *, profiles: str = PROFILES,
                    profile: str = "bench") -> tuple[subprocess.Popen[str], list[str]]:
    (folder / "profiles.toml").write_text(profiles)
    argv = [sys.executable, "-m", "fleetctl.sim", "--profiles", str(folder / "profiles.toml"),
            "--log-level", "ERROR", "--model", MODEL, "--model", OTHER]
    for i in range(endpoints):
        argv += ["--pool", f"e{i}={profile}@0"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    urls = []
    while len(urls) < endpoints:
        line = proc.stdout.readline()
        if "http://" not in line:
            proc.kill()
            raise SystemExit(f"simulator did not start: {line!r}")
        urls.append(line.split(" on ")[1].split()[0])  # "sim pool NAME (…) on URL models: …"
    return proc, urls


def prefix_counters(urls: list[str]) -> tuple[float, float]:
    """(queries, hits) summed over the endpoints' vllm:prefix_cache_* counters."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    queries = hits = 0.0
    for url in urls:
        text = httpx.get(f"{url}/metrics", timeout=10).text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "vllm:prefix_cache_queries_total":
                    queries += sample.value
                elif sample.name == "vllm:prefix_cache_hits_total":
                    hits += sample.value
    return queries, hits


def desired_for(arm: str, urls: list[str], prefix_bytes: int) -> Any:
    from fleetctl.traffic.gateways.base import (
        DesiredState,
        PoolTarget,
        PrefixAffinity,
        RouteSpec,
    )

    affinity = PrefixAffinity("prompt", prefix_bytes)
    chat = RouteSpec(key="chat", model=MODEL, latency_class="", residency="", revision=1,
                     weights={"pool": 10_000})
    other = replace(chat, key="other", model=OTHER)
    routes = {"least-request": (chat, other),
              "affinity": (replace(chat, affinity=affinity), other),
              "hashed-no-key": (replace(chat, affinity=affinity), other)}[arm]
    return DesiredState(routes=routes, pools={"pool": PoolTarget("pool", tuple(urls), "US")})


def run_arm(arm: str, round_no: int, gateway_url: str, urls: list[str], trace: list[Any],
            args: argparse.Namespace) -> dict[str, float]:
    from fleetctl.bench.client import Endpoint
    from fleetctl.bench.runner import LevelPlan, run_level
    from fleetctl.bench.stats import summarize

    model = OTHER if arm == "hashed-no-key" else MODEL
    plan = LevelPlan(warmup_s=args.warmup, window_s=args.window, min_samples=args.concurrency,
                     max_duration_s=args.warmup + args.window * 4, request_timeout_s=120)
    before = prefix_counters(urls)
    level = asyncio.run(run_level(Endpoint(base_url=gateway_url, model=model), trace, plan,
                                  concurrency=args.concurrency,
                                  request_id_prefix=f"{arm}-{round_no}"))
    after = prefix_counters(urls)
    summary = summarize(level.samples())
    queries, hits = after[0] - before[0], after[1] - before[1]
    return {"hit_rate": hits / queries if queries else 0.0,
            "ttft_p50_ms": (summary.ttft_p50_s or 0.0) * 1000,
            "ttft_p95_ms": (summary.ttft_p95_s or 0.0) * 1000,
            "tokens_per_s": summary.output_tokens_per_s,
            "requests_per_s": summary.request_rate_per_s,
            "errors": float(summary.n_errors + summary.n_timeouts),
            "measured": float(summary.n_measured)}


COLUMNS = ("hit_rate", "ttft_p50_ms", "ttft_p95_ms", "tokens_per_s", "requests_per_s",
           "errors", "measured")


def show(label: str, row: dict[str, float]) -> None:
    print(f"{label:28} hit {row['hit_rate']:6.1%}  TTFT p50 {row['ttft_p50_ms']:8.1f} ms"
          f"  p95 {row['ttft_p95_ms']:8.1f} ms  {row['tokens_per_s']:8.1f} tok/s"
          f"  {row['requests_per_s']:6.2f} req/s  errors {row['errors']:.0f}"
          f" of {row['measured']:.0f}", flush=True)


def measure_cost(args: argparse.Namespace) -> None:
    import http.client
    import json
    import random
    import time

    from fleetctl.bench.client import WORDS
    from fleetctl.bench.stats import percentile
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess
    from fleetctl.traffic.gateways.base import DesiredState, PoolTarget, PrefixAffinity, RouteSpec
    from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter

    folder = Path(tempfile.mkdtemp(prefix="bench-prefix-affinity-cost-"))
    sim, urls = start_simulator(folder, 2, profiles=COST_PROFILES, profile="free")
    envoy = EnvoyProcess(folder / "envoy", free_port(), free_port(), access_log=False)
    words = random.Random(args.seed).choices(WORDS, k=args.shared + args.unique)
    bodies = {arm: json.dumps({"model": model, "max_tokens": 1, "messages": [
        {"role": "user", "content": " ".join(words)}]}).encode()
        for arm, model in (("affinity", MODEL), ("least-request", OTHER))}
    print(f"gateway cost: {len(bodies['affinity']):,}-byte chat, prefix_bytes "
          f"{args.prefix_bytes}, {args.requests} requests per arm and round, alternating")
    try:
        envoy.start(timeout_s=60)
        route = RouteSpec(key="hashed", model=MODEL, latency_class="", residency="",
                          revision=1, weights={"pa": 10_000},
                          affinity=PrefixAffinity("prompt", args.prefix_bytes))
        plain = RouteSpec(key="plain", model=OTHER, latency_class="", residency="",
                          revision=1, weights={"pb": 10_000})
        result = EnvoyAdapter(envoy.gateway("bench", load_timeout_s=30)).apply(DesiredState(
            routes=(route, plain), pools={"pa": PoolTarget("pa", (urls[0],), "US"),
                                          "pb": PoolTarget("pb", (urls[1],), "US")}))
        if not result.applied:
            raise SystemExit(f"not applied: {result.detail}")
        conn = http.client.HTTPConnection("127.0.0.1", envoy.listen_port, timeout=30)
        added_p50, added_p99 = [], []
        for round_no in range(args.rounds):
            times: dict[str, list[float]] = {"affinity": [], "least-request": []}
            for i in range(args.requests * 2 + 20):
                arm = ("affinity", "least-request")[(i + round_no) % 2]
                started = time.perf_counter()
                conn.request("POST", "/v1/chat/completions", body=bodies[arm],
                             headers={"content-type": "application/json"})
                answer = conn.getresponse()
                answer.read()
                if answer.status != 200:
                    raise SystemExit(f"{arm}: HTTP {answer.status}")
                if i >= 20:  # the first few warm the connections and the caches
                    times[arm].append((time.perf_counter() - started) * 1000)
            on = (percentile(times["affinity"], 50) or 0, percentile(times["affinity"], 99) or 0)
            off = (percentile(times["least-request"], 50) or 0,
                   percentile(times["least-request"], 99) or 0)
            added_p50.append(on[0] - off[0])
            added_p99.append(on[1] - off[1])
            print(f"round {round_no + 1}: affinity p50 {on[0]:.3f} p99 {on[1]:.3f} ms; "
                  f"least-request p50 {off[0]:.3f} p99 {off[1]:.3f} ms; added p50 "
                  f"{added_p50[-1]:+.3f} p99 {added_p99[-1]:+.3f} ms", flush=True)
        print(f"median added: p50 {statistics.median(added_p50):+.3f} ms, p99 "
              f"{statistics.median(added_p99):+.3f} ms")
    finally:
        envoy.stop()
        sim.terminate()
        sim.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument("--groups", type=int, default=32, help="shared-prefix groups")
    parser.add_argument("--shared", type=int, default=6144, help="shared prefix tokens")
    parser.add_argument("--unique", type=int, default=1024, help="each prompt's own tokens")
    parser.add_argument("--output", type=int, default=256, help="output tokens (issue: ~1k)")
    parser.add_argument("--prefix-bytes", type=int, default=4096)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--window", type=float, default=30.0)
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--only", choices=("arms", "cost"), default="arms")
    parser.add_argument("--requests", type=int, default=1000, help="cost: per arm and round")
    args = parser.parse_args()

    import django

    django.setup()
    if args.only == "cost":
        measure_cost(args)
        return
    from fleetctl.bench.traces.synthetic import Arrival, Dist, generate
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess
    from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter

    trace = list(generate(n=2000, seed=args.seed, prompt_tokens=Dist.constant(args.unique),
                          completion_tokens=Dist.constant(args.output),
                          arrival=Arrival.constant(1.0), shared_prefix_groups=args.groups,
                          shared_prefix_tokens=args.shared))
    folder = Path(tempfile.mkdtemp(prefix="bench-prefix-affinity-"))
    sim, urls = start_simulator(folder, args.endpoints)
    envoy = EnvoyProcess(folder / "envoy", free_port(), free_port(), access_log=False)
    print(f"{args.endpoints} endpoints (prefix cache 150,000 tokens each), {args.groups} groups"
          f" of {args.shared} shared + {args.unique} own tokens, {args.output} out, "
          f"concurrency {args.concurrency}, prefix_bytes {args.prefix_bytes}, "
          f"{args.rounds} rounds of warm-up {args.warmup:g} s + window {args.window:g} s")
    rows: dict[str, list[dict[str, float]]] = {arm: [] for arm in ARMS}
    try:
        envoy.start(timeout_s=60)
        adapter = EnvoyAdapter(envoy.gateway("bench", load_timeout_s=30))
        for round_no in range(args.rounds):
            for arm in ARMS:
                result = adapter.apply(desired_for(arm, urls, args.prefix_bytes))
                if not result.applied:
                    raise SystemExit(f"{arm}: not applied: {result.detail}")
                rows[arm].append(run_arm(arm, round_no, envoy.listen_url, urls, trace, args))
                show(f"round {round_no + 1} {arm}", rows[arm][-1])
    finally:
        envoy.stop()
        sim.terminate()
        sim.wait(timeout=30)
    print("\nmedians over rounds (ratio to least-request):")
    medians = {arm: {c: statistics.median(r[c] for r in rows[arm]) for c in COLUMNS}
               for arm in ARMS}
    base = medians["least-request"]
    for arm in ARMS:
        show(arm, medians[arm])
        if arm != "least-request":
            ratios = "  ".join(f"{c} x{medians[arm][c] / base[c]:.2f}" for c in COLUMNS[:5]
                               if base[c])
            print(f"{'':28} {ratios}")


if __name__ == "__main__":
    main()
