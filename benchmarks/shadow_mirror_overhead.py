"""What mirroring a route to the shadow collector costs the live request: TTFT through Envoy
with the route's mirror at 0 % and at 100 %.

One real Envoy, one simulated pool behind it and the real shadow collector
(`python -m fleetctl.shadow.collector`). The Envoy adapter pushes the route (as a gateway push
does, no database or Celery); the mirror share is the route's `mirror_bp` in the desired
state, which Envoy holds as a runtime fraction, so switching it is a runtime change, not a
reload. Rounds are interleaved (0 % then 100 %, the next round 100 % then 0 %), each setting
sends `--requests` streamed chat requests at `--concurrency` through Envoy and measures the
time to the first content chunk; reported: per setting the median over rounds of each
round's TTFT p50 and p99, and the difference (target ≤ 1 ms at p50). The collector answers
every copy at once with 204; with no shadow run for the route it counts the copies as
unmatched, which is printed to show that mirroring happened.

    .venv/bin/python benchmarks/shadow_mirror_overhead.py [--rounds 10] [--requests 200]
        [--concurrency 8] [--max-tokens 32]

Redis: REDIS_URL (default redis://127.0.0.1:6379/9), where the collector counts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")
from fleetctl.demo.devstack import local_destinations  # noqa: E402

local_destinations(os.environ)
# The drain benchmark's small, fast pool profile (a 4 ms decode step, no network delay).
from benchmarks.drain_latency import MODEL, PROFILES  # noqa: E402

ROUTE = "llama"


def wait_http(url: str, what: str, log: Path, timeout_s: float = 30) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise SystemExit(f"{what} did not start; see {log}") from None
            time.sleep(0.05)


def start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=open(log, "wb"))


@contextlib.contextmanager
def sim_and_collector(work: Path) -> Iterator[tuple[str, str]]:
    """The benchmark pool (a simulator with PROFILES) and the real shadow collector, each on
    a free port and answering; (pool URL, collector URL); both stopped on the way out."""
    from fleetctl.core.ports import free_port

    (work / "profiles.toml").write_text(PROFILES)
    sim_port, collector_port = free_port(), free_port()
    sim = start([sys.executable, "-m", "fleetctl.sim", "--profiles",
                 str(work / "profiles.toml"), "--log-level", "WARNING", "--model", MODEL,
                 "--pool", f"bench=bench@{sim_port}"], work / "sim.log")
    collector = start([sys.executable, "-m", "fleetctl.shadow.collector", "--host",
                       "127.0.0.1", "--port", str(collector_port)], work / "collector.log")
    try:
        wait_http(f"http://127.0.0.1:{sim_port}/health", "the simulator", work / "sim.log")
        wait_http(f"http://127.0.0.1:{collector_port}/healthz", "the collector",
                  work / "collector.log")
        yield f"http://127.0.0.1:{sim_port}", f"http://127.0.0.1:{collector_port}"
    finally:
        for proc in (collector, sim):
            proc.terminate()
            proc.wait(timeout=15)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def load(url: str, requests: int, concurrency: int, max_tokens: int,
               offset: int) -> tuple[list[float], int]:
    """`requests` streamed requests, `concurrency` at a time: each one's TTFT (ms) and how
    many failed."""
    import aiohttp

    ttfts: list[float] = []
    failed = 0
    counter = iter(range(requests))

    async def worker(session: aiohttp.ClientSession) -> None:
        nonlocal failed
        for i in counter:
            body = {"model": MODEL, "max_tokens": max_tokens, "stream": True, "temperature": 0,
                    "messages": [{"role": "user", "content": f"question {offset + i}"}]}
            started = time.perf_counter()
            first: float | None = None
            try:
                async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                    async for line in resp.content:
                        if first is None and line.startswith(b"data: {") \
                                and b'"content"' in line:
                            first = time.perf_counter()
                    ok = resp.status == 200 and first is not None
            except aiohttp.ClientError:
                ok = False
            if ok and first is not None:
                ttfts.append((first - started) * 1000)
            else:
                failed += 1

    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    return ttfts, failed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--requests", type=int, default=200, help="per setting per round")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()

    import logging

    import django

    django.setup()
    logging.getLogger("httpx").setLevel(logging.WARNING)
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess
    from fleetctl.shadow import live
    from fleetctl.traffic.gateways.base import DesiredState, GatewaySpec, PoolTarget, RouteSpec
    from fleetctl.traffic.gateways.registry import adapter_for

    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        work = Path(tmp)
        pool_url, collector_url = stack.enter_context(sim_and_collector(work))
        envoy = EnvoyProcess(work / "envoy", free_port(), free_port())
        try:
            envoy.start(60)
            adapter = adapter_for(GatewaySpec("bench", "envoy", envoy.admin_url,
                                              {"config_dir": str(envoy.workdir)}))
            pools = {"bench": PoolTarget("bench", (pool_url,), "US")}

            def mirror(bp: int) -> None:
                desired = DesiredState(
                    routes=(RouteSpec(key=ROUTE, model=MODEL, latency_class="", residency="",
                                      revision=1, weights={"bench": 10_000}, mirror_bp=bp),),
                    pools=pools, mirror_url=collector_url)
                adapter.apply(desired)
                adapter.read_back()
                ok, why = adapter.mirror_matches(desired)
                if not ok:
                    raise SystemExit(f"Envoy did not take mirror {bp} bp: {why}")

            mirror(0)
            asyncio.run(load(envoy.listen_url, 50, args.concurrency, args.max_tokens, 0))
            before = live.unmatched().get(ROUTE, 0)
            results: dict[int, list[tuple[float, float]]] = {0: [], 10_000: []}
            failed = {0: 0, 10_000: 0}
            sent = 0
            for n in range(args.rounds):
                for bp in ((0, 10_000) if n % 2 == 0 else (10_000, 0)):
                    mirror(bp)
                    ttfts, bad = asyncio.run(load(envoy.listen_url, args.requests,
                                                  args.concurrency, args.max_tokens, sent))
                    sent += args.requests
                    failed[bp] += bad
                    results[bp].append((statistics.median(ttfts), percentile(ttfts, 0.99)))
                    print(f"round {n + 1} mirror {bp // 100:>3} %: TTFT p50 "
                          f"{results[bp][-1][0]:.2f} ms p99 {results[bp][-1][1]:.2f} ms"
                          f"{f' ({bad} failed)' if bad else ''}", flush=True)
            mirror(0)
            time.sleep(1.0)  # the last copies reach the collector
            mirrored = live.unmatched().get(ROUTE, 0) - before
        finally:
            envoy.stop()

    summary = {}
    for bp, rows in results.items():
        summary[bp] = (statistics.median(r[0] for r in rows),
                       statistics.median(r[1] for r in rows))
    print(f"\n{args.rounds} rounds x {args.requests} streamed requests per setting, "
          f"concurrency {args.concurrency}, {args.max_tokens} tokens each, through Envoy:")
    for bp, (p50, p99) in summary.items():
        print(f"  mirror {bp // 100:>3} %: TTFT p50 {p50:.2f} ms, p99 {p99:.2f} ms "
              f"(median over rounds); failed requests {failed[bp]}")
    print(f"  difference (100 % - 0 %): p50 {summary[10_000][0] - summary[0][0]:+.2f} ms, "
          f"p99 {summary[10_000][1] - summary[0][1]:+.2f} ms (target ≤ 1 ms at p50)")
    print(f"  copies the collector counted: {mirrored} of "
          f"{args.rounds * args.requests} requests sent with mirror 100 %")
    print(json.dumps({"p50_ms": {bp // 100: v[0] for bp, v in summary.items()},
                      "p99_ms": {bp // 100: v[1] for bp, v in summary.items()},
                      "mirrored": mirrored}))


if __name__ == "__main__":
    main()
