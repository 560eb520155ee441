"""TTFT p95 on a route in the minute after a drain its primary cannot carry: the
capacity-checked drain (spread over an in-jurisdiction pool that carries weight) against a
forced one (everything to the primary at once).

One real Envoy on loopback; three simulated pools of one profile, `cap` (at most C = 8
sequences decoded at once, ~25 ms a step, so a 16-token answer takes ~0.4 s and a ninth
stream waits): `primary`, `spread` (same jurisdiction) and `drained`. Their capacity is
benchmark evidence of C streams each (recorded here as the figure the profile is built for,
not measured by this script). The route's split: primary 50 %, spread 10 %, drained 40 %.
Load: 1.5 x C closed-loop streaming clients (a process of their own, asyncio + httpx) on
the route — 150 % of the primary's capacity — so forced, the primary gets ~90 % of 12
streams for 8 slots. Each round and mode: warm up, one gateway traffic sample (the live
streams the check reads), drain `drained` (a person's drain: capacity-checked, may step; or
`force`), then the TTFT of every request started in the next --window-s seconds; restore.
Modes alternate in order each round. Reported per mode: the check's decision, and the
median over rounds of the window's TTFT p95 (and p50); the ratio forced / checked.

Real parts throughout: Envoy, the simulator, PostgreSQL (`DATABASE_URL`, default a local
`h6_drain_capacity`, recreated), Redis (`REDIS_URL`, default db 6), a Celery worker for the
pushes' follow-ups. On 2 shared cores the absolute figures carry the machine's noise; the
ratio is the figure.

    .venv/bin/python benchmarks/drain_capacity.py [--rounds 2] [--window-s 60] [--warm-s 10]
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = "llama-3.1-8b-instruct"
SLOTS = 8  # the profile's max_seqs: the capacity C of each pool
PROFILES = f"""
[profiles.cap]
base = "h200"
max_seqs = {SLOTS}
decode_base_ms = 25.0
decode_per_seq_ms = 0.01
network_latency_ms = 0.0
divergence_rate = 0.0
replica_noise = 0.0
max_context = 4096
"""
SPLIT = {"primary": 50, "spread": 10, "drained": 40}


def setup_env() -> None:
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/h6_drain_capacity")
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/6")
    from benchmarks.ramp_fault_to_drained import setup_env as fresh_database

    fresh_database(os.environ["DATABASE_URL"].rsplit("/", 1)[1])


def _load_main(url: str, streams: int, stop: Any, out: Any) -> None:
    """`streams` clients, each sending its next streamed request as soon as the last ends;
    every answer is put on `out` as (started at, TTFT ms or None, ok)."""
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)

    async def client_loop(client: httpx.AsyncClient, n: int) -> None:
        i = 0
        while not stop.is_set():
            i += 1
            body = {"model": MODEL, "messages": [{"role": "user", "content": f"c{n} q{i}"}],
                    "max_tokens": 16, "stream": True}
            started, first, ok = time.time(), None, False
            t0 = time.perf_counter()
            try:
                async with client.stream("POST", f"{url}/v1/chat/completions",
                                         json=body) as resp:
                    async for line in resp.aiter_lines():
                        if first is None and line.startswith("data:") and '"content"' in line:
                            first = (time.perf_counter() - t0) * 1000
                    ok = resp.status_code == 200 and first is not None
            except Exception:  # a failed request counts as failed, whatever it was
                ok = False
            out.put((started, first, ok))

    async def run() -> None:
        async with httpx.AsyncClient(timeout=60,
                                     limits=httpx.Limits(max_connections=streams * 2)) as c:
            await asyncio.gather(*(client_loop(c, n) for n in range(streams)))

    asyncio.run(run())


class Load:
    def __init__(self, url: str, streams: int) -> None:
        self._stop = multiprocessing.Event()
        self._out: multiprocessing.Queue[tuple[float, float | None, bool]] = (
            multiprocessing.Queue())
        self._proc = multiprocessing.Process(target=_load_main,
                                             args=(url, streams, self._stop, self._out),
                                             daemon=True)
        self.results: list[tuple[float, float | None, bool]] = []

    def start(self) -> Load:
        self._proc.start()
        return self

    def drain_queue(self) -> None:
        import queue

        while True:
            try:
                self.results.append(self._out.get_nowait())
            except queue.Empty:
                return

    def stop(self) -> None:
        self._stop.set()
        self._proc.join(timeout=70)
        self.drain_queue()


def check_cost(route: Any, pool: str, repeats: int = 50) -> str:
    """What the capacity check adds to a drain's transaction: the check of one route as the
    drain service makes it (reads and decision, no write), timed in this process."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from fleetctl.traffic import drain_capacity, selectors

    weights = selectors.revision_current(route=route).weights
    times, queries, decision = [], 0, ""
    for _ in range(repeats):
        began = time.perf_counter()
        with CaptureQueriesContext(connection) as captured:
            found = drain_capacity.readings([route], {route.pk: weights})
            _, note = drain_capacity.check(
                route=route, weights=weights, remove={pool}, found=found, force=False,
                eligible=selectors.pools_eligible(route=route), stepping=True)
        times.append((time.perf_counter() - began) * 1000)
        queries, decision = len(captured.captured_queries), note["decision"]
    return (f"capacity check of one route ({decision}): median {statistics.median(times):.1f} "
            f"ms, max {max(times):.1f} ms over {repeats}, {queries} queries")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--window-s", type=float, default=60.0)
    parser.add_argument("--warm-s", type=float, default=10.0)
    parser.add_argument("--load", type=float, default=1.5,
                        help="concurrent streams as a multiple of the primary's capacity")
    args = parser.parse_args()
    setup_env()

    from fleetctl.accounts.actor import Actor
    from fleetctl.bench.stats import percentile
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess
    from fleetctl.fleet.services import region_create
    from fleetctl.traffic import push, sampling
    from fleetctl.traffic.services import drain_request, drain_restore, route_create
    from migrations_plan import services as plans
    from tests.ramps import e2e
    from tests.sim.simproc import SimProcess

    actor = Actor.for_system("bench")
    work = Path(tempfile.mkdtemp(prefix="drain-capacity-"))
    closers: list[Any] = []
    began = time.monotonic()
    figures: dict[str, list[tuple[float, float, int, str]]] = {"checked": [], "forced": []}
    try:
        (work / "profiles.toml").write_text(PROFILES)
        sim_args = ["--profiles", str(work / "profiles.toml"), "--log-level", "WARNING",
                    "--model", MODEL]
        for name in SPLIT:
            sim_args += ["--pool", f"{name}=cap@0"]
        sim = SimProcess(sim_args, len(SPLIT), work / "sim.log")
        closers.append(sim.stop)
        region = region_create(actor=actor, code="us-east", name="US East", jurisdiction="US")
        pools = e2e.make_pools(actor, sim, list(SPLIT), region)
        for run, name in enumerate(("primary", "spread"), start=1):
            plans.evidence_record(
                actor=actor, pool=pools[name], kind="benchmark", verdict="pass",
                summary=f"run {run}", model_id=MODEL, source=f"benchmark run {run}",
                data={"run": run, "timing": "concurrency", "best_concurrency": SLOTS,
                      "output_tokens_per_s": SLOTS * 16 / 0.4, "cost_per_1m": None,
                      "measured_on": "2026-12-07", "endpoints": 1,
                      "slo": {"ttft_p95_ms": 800, "tpot_p95_ms": 60, "error_rate": 0.01}})
        route = route_create(actor=actor, name="llama", model_id=MODEL,
                             primary_pool=pools["primary"], weights=SPLIT, reason="benchmark")
        envoy = EnvoyProcess(work / "envoy", free_port(), free_port()).start(timeout_s=60)
        closers.append(envoy.stop)
        worker = e2e.start_worker(dict(os.environ), work / "worker.log",
                                  name=f"drain-capacity-{os.getpid()}")
        closers.append(lambda: (worker.terminate(), worker.wait(timeout=20)))
        gateway = e2e.make_gateway(actor, envoy, [route], name="envoy-1")
        streams = round(args.load * SLOTS)
        load = Load(envoy.listen_url, streams).start()
        closers.append(load.stop)
        print(f"1 Envoy, pools primary/spread/drained of {SLOTS} slots each (capacity "
              f"evidence {SLOTS} streams), split {SPLIT}, {streams} closed-loop streams "
              f"({args.load:g} x the primary's capacity); window {args.window_s:g} s, "
              f"{args.rounds} round(s)", flush=True)
        time.sleep(args.warm_s)
        sampling.traffic_sample(gateway=gateway)
        print(check_cost(route, "drained"), flush=True)
        for round_no in range(1, args.rounds + 1):
            modes = ["checked", "forced"] if round_no % 2 else ["forced", "checked"]
            for mode in modes:
                time.sleep(args.warm_s)  # the split settles under load (a warm-up, no assertion)
                sampling.traffic_sample(gateway=gateway)
                drain = push.drain_push_now(drain_request(
                    actor=actor, pool=pools["drained"], reason=f"benchmark {mode}",
                    force=mode == "forced", stepping=True))
                at = time.time()
                decision = drain.capacity.get("decision", "?")
                time.sleep(args.window_s)
                load.drain_queue()
                window = [r for r in load.results if at <= r[0] < at + args.window_s]
                ttft = [r[1] for r in window if r[1] is not None]
                failed = sum(1 for r in window if not r[2])
                p95, p50 = percentile(ttft, 95), percentile(ttft, 50)
                figures[mode].append((p95 or 0.0, p50 or 0.0, failed, decision))
                print(f"round {round_no} {mode:>7}: decision {decision}; split after "
                      f"{drain.new_revisions[0].weights if drain.new_revisions else '?'}; "
                      f"{len(ttft)} answers, TTFT p95 {p95:.0f} ms, p50 {p50:.0f} ms, "
                      f"{failed} failed", flush=True)
                push.drain_push_now(drain_restore(actor=actor, drain=drain,
                                                  reason="benchmark round over"))
                load.results.clear()
        print()
        for mode, rows in figures.items():
            print(f"{mode:>7}: decision {sorted({r[3] for r in rows})}; TTFT p95 median "
                  f"{statistics.median(r[0] for r in rows):.0f} ms (rounds "
                  f"{', '.join(f'{r[0]:.0f}' for r in rows)}); p50 median "
                  f"{statistics.median(r[1] for r in rows):.0f} ms; failed "
                  f"{sum(r[2] for r in rows)}")
        checked = statistics.median(r[0] for r in figures["checked"])
        forced = statistics.median(r[0] for r in figures["forced"])
        print(f"ratio forced / checked TTFT p95: {forced / checked:.2f}"
              if checked else "ratio: no answers")
        print(f"wall time {time.monotonic() - began:.0f} s")
    finally:
        for close in reversed(closers):
            try:
                close()
            except Exception as exc:  # stop everything we can
                print(f"(while stopping: {exc})", flush=True)


if __name__ == "__main__":
    main()
