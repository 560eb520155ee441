"""How many concurrent streams and streamed tokens/s can one simulator process serve
while keeping its schedule honest?

Starts one `python -m fleetctl.sim` process (one pool, a profile sized for the load), then
for each concurrency level runs a separate client process that keeps N streaming chat
requests open (aiohttp, `ignore_eos`, fixed max_tokens) and counts content chunks that
arrive inside a measurement window. The simulator's schedule lag comes from its own ground
truth (every scheduler step: intended vs actual wake-up) for the same window.

Prints figures; asserts nothing. Usage:

    .venv/bin/python benchmarks/sim_throughput.py [--levels 64,128,256,384] [--reps 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
MODEL = "llama-3.1-8b-instruct"
TARGET = {"streams": 256, "tokens_per_s": 5000.0, "lag_p99_ms": 2.0}

# Sized for the sweep: 512 sequences, KV for all of them, no network delay, no divergence.
# Step time 20 ms + 0.04 ms per sequence: 256 streams ⇒ ~30 ms steps ⇒ ~8,500 tokens/s ideal.
BENCH_PROFILE = """
[profiles.bench]
base = "h200"
description = "simulated H200-class (benchmark sizing)"
max_seqs = 512
kv_cache_tokens = 2000000
prefix_cache_tokens = 200000
max_waiting = 4096
decode_base_ms = 20.0
decode_per_seq_ms = 0.04
network_latency_ms = 0.0
divergence_rate = 0.0
"""


# ---- client process --------------------------------------------------------------------


async def _stream_worker(
    session: Any, url: str, worker: int, window: tuple[float, float], stats: dict[str, Any],
    max_tokens: int, stagger_s: float,
) -> None:
    start, end = window
    # Staggered starts and varied lengths, as real traffic has: a synchronised herd would
    # measure the burst of N simultaneous arrivals rather than sustained streaming.
    lengths = random.Random(worker)
    await asyncio.sleep(stagger_s * lengths.random())
    n = 0
    while time.monotonic() < end:
        n += 1
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"benchmark worker {worker} request {n}"}],
            "max_tokens": lengths.randint(max_tokens // 2, max_tokens * 3 // 2),
            "ignore_eos": True,
            "stream": True,
        }
        sent = time.monotonic()
        try:
            async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
                if resp.status != 200:
                    stats["errors"] += 1
                    await asyncio.sleep(0.05)
                    continue
                first = True
                async for line in resp.content:
                    if not line.startswith(b'data: {"id"') or b'"content":' not in line:
                        continue
                    now = time.monotonic()
                    if first:
                        first = False
                        if start <= now <= end:
                            stats["ttft"].append(now - sent)
                        continue  # the role chunk carries no token
                    if start <= now <= end:
                        stats["tokens"] += 1  # the simulator sends one token per chunk
                    if now > end:
                        return
                stats["completed"] += 1
        except Exception:
            stats["errors"] += 1


async def _client_loop_lag(end: float, lags: list[float]) -> None:
    """The client's own schedule lag: if this grows, the client (not the sim) is the limit."""
    loop = asyncio.get_running_loop()
    while loop.time() < end:
        due = loop.time() + 0.01
        await asyncio.sleep(0.01)
        lags.append(loop.time() - due)


async def run_client(
    url: str, concurrency: int, warmup_s: float, measure_s: float, max_tokens: int
) -> dict[str, Any]:
    import aiohttp

    t0 = time.monotonic()
    window = (t0 + warmup_s, t0 + warmup_s + measure_s)
    stats: dict[str, Any] = {"tokens": 0, "completed": 0, "errors": 0, "ttft": []}
    lags: list[float] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        workers = [
            asyncio.create_task(
                _stream_worker(session, url, i, window, stats, max_tokens, warmup_s / 2)
            )
            for i in range(concurrency)
        ]
        ticker = asyncio.create_task(_client_loop_lag(window[1], lags))
        await asyncio.sleep(window[1] - time.monotonic())
        await ticker
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
    lags.sort()
    ttft = sorted(stats["ttft"])
    return {
        "window": window,
        "tokens_per_s": stats["tokens"] / measure_s,
        "completed": stats["completed"],
        "errors": stats["errors"],
        "ttft_p50_ms": _pct(ttft, 50) * 1000,
        "client_lag_p99_ms": _pct(lags, 99) * 1000,
    }


def _pct(sorted_values: list[float], pct: float) -> float:
    if not sorted_values:
        return float("nan")
    rank = max(0, -(-len(sorted_values) * pct // 100) - 1)
    return sorted_values[int(rank)]


# ---- orchestration ---------------------------------------------------------------------


def start_simulator(profile_file: Path) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "fleetctl.sim", "--profiles", str(profile_file),
         "--pool", "bench=bench@0", "--record-ground-truth", "--ground-truth-size", "4000",
         "--log-level", "WARNING"],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "http://" not in line:
        proc.kill()
        raise SystemExit(f"simulator did not start: {line!r}")
    return proc, line.split(" on ")[1].split()[0]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_level(
    url: str, sim_pid: int, concurrency: int, args: argparse.Namespace
) -> dict[str, Any]:
    load_before = os.getloadavg()[0]
    with httpx.Client(timeout=30) as admin:
        admin.post(f"{url}/admin/ground-truth", json={"enabled": True, "clear": True})
        episodes_before = admin.get(f"{url}/admin/state").json()["schedule_lag"][
            "lagging_episodes"]
        cpu_before, wall_before = cpu_seconds(sim_pid), time.monotonic()
        client = subprocess.run(
            [sys.executable, __file__, "--client", url, "--concurrency", str(concurrency),
             "--warmup", str(args.warmup), "--measure", str(args.measure),
             "--max-tokens", str(args.max_tokens)],
            cwd=REPO, capture_output=True, text=True, check=True,
        )
        sim_cpu = (cpu_seconds(sim_pid) - cpu_before) / (time.monotonic() - wall_before)
        result = json.loads(client.stdout)
        start, end = result["window"]
        steps = admin.get(f"{url}/admin/ground-truth", params={"kind": "steps"}).json()["steps"]
        state = admin.get(f"{url}/admin/state").json()["schedule_lag"]
    lags = sorted(s["lag_s"] for s in steps if start <= s["actual_mono"] <= end)
    flushes = sorted(
        s["flush_s"] for s in steps if start <= s["actual_mono"] <= end and s["flush_s"] is not None
    )
    batches = [s["batch"] for s in steps if start <= s["actual_mono"] <= end]
    result.update(
        lag_p50_ms=_pct(lags, 50) * 1000,
        lag_p99_ms=_pct(lags, 99) * 1000,
        flush_p50_ms=_pct(flushes, 50) * 1000,
        flush_p99_ms=_pct(flushes, 99) * 1000,
        steps=len(lags),
        mean_batch=statistics.fmean(batches) if batches else 0.0,
        flagged=state["lagging_episodes"] > episodes_before or state["lagging"],
        sim_cpu_pct=100 * sim_cpu,
        load_before=load_before,
    )
    return result


def run_sweep(args: argparse.Namespace) -> None:
    levels = [int(x) for x in args.levels.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        profile_file = Path(tmp) / "bench.toml"
        profile_file.write_text(BENCH_PROFILE)
        proc, url = start_simulator(profile_file)
        try:
            print(f"simulator {url} (pid {proc.pid}); client: 1 separate process per level, "
                  f"aiohttp; {os.cpu_count()} cores shared by simulator and client")
            print("NOTE: the client competes with the simulator for the same cores; "
                  "client lag is the client's own event-loop lag, sim CPU % the simulator's "
                  "CPU use over the level (100 = one core), load1 the 1-minute load average "
                  "before the level (anything else running on the machine shows there).")
            print("lag: a step's actual wake-up minus its deadline (the simulator's own ground "
                  "truth); flush: wake-up until that step's chunks were all handed to the "
                  "kernel.")
            print(f"window: {args.warmup:g}s warm-up (starts staggered over the first half) + "
                  f"{args.measure:g}s measured; max_tokens uniform in "
                  f"[{args.max_tokens // 2}, {args.max_tokens * 3 // 2}], ignore_eos; "
                  f"medians over {args.reps} repetitions\n")
            print(" ".join(f"{title:>{width}}" for title, width, _ in COLUMNS))
            for level in levels:
                reps = [measure_level(url, proc.pid, level, args) for _ in range(args.reps)]
                print(_row(level, reps), flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=10)
    print(f"\ntarget: >= {TARGET['streams']} streams, >= {TARGET['tokens_per_s']:.0f} "
          f"tokens/s, p99 schedule lag <= {TARGET['lag_p99_ms']} ms")


def _row(level: int, reps: list[dict[str, Any]]) -> str:
    summary: dict[str, Any] = {
        key: statistics.median(r[key] for r in reps)
        for key in ("tokens_per_s", "lag_p50_ms", "lag_p99_ms", "flush_p50_ms", "flush_p99_ms",
                    "mean_batch",
                    "ttft_p50_ms", "client_lag_p99_ms", "sim_cpu_pct", "load_before")
    }
    summary.update(
        streams=level,
        ideal=level / ((20.0 + 0.04 * level) / 1000.0),
        flagged=f"{sum(bool(r['flagged']) for r in reps)}/{len(reps)}",
        errors=sum(r["errors"] for r in reps),
    )
    return " ".join(f"{fmt(summary):>{width}}" for _, width, fmt in COLUMNS)


# (title, width, value formatter) for the results table; values are medians over reps.
COLUMNS: list[tuple[str, int, Any]] = [
    ("streams", 7, lambda r: f"{r['streams']}"),
    ("tokens/s", 9, lambda r: f"{r['tokens_per_s']:.0f}"),
    ("ideal/s", 8, lambda r: f"{r['ideal']:.0f}"),
    ("lag p50 ms", 10, lambda r: f"{r['lag_p50_ms']:.3f}"),
    ("lag p99 ms", 10, lambda r: f"{r['lag_p99_ms']:.3f}"),
    ("flush p50 ms", 12, lambda r: f"{r['flush_p50_ms']:.2f}"),
    ("flush p99 ms", 12, lambda r: f"{r['flush_p99_ms']:.2f}"),
    ("flagged", 7, lambda r: r["flagged"]),
    ("batch", 5, lambda r: f"{r['mean_batch']:.0f}"),
    ("ttft p50 ms", 11, lambda r: f"{r['ttft_p50_ms']:.1f}"),
    ("client lag p99 ms", 17, lambda r: f"{r['client_lag_p99_ms']:.1f}"),
    ("sim CPU %", 9, lambda r: f"{r['sim_cpu_pct']:.0f}"),
    ("load1", 5, lambda r: f"{r['load_before']:.1f}"),
    ("errors", 6, lambda r: f"{r['errors']}"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="64,128,256,384")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--measure", type=float, default=5.0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--client", metavar="URL", help=argparse.SUPPRESS)
    parser.add_argument("--concurrency", type=int, default=64, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.client:
        result = asyncio.run(run_client(args.client, args.concurrency, args.warmup,
                                        args.measure, args.max_tokens))
        print(json.dumps(result))
        return
    run_sweep(args)


if __name__ == "__main__":
    main()
