"""How accurately does the benchmark runner measure TTFT and TPOT?

Two servers, each in its own process, at 1, 8 and 32 concurrent streams (fixed concurrency):

(a) `fleetctl sim` with a paced profile and ground truth recorded. The reference is what the
    simulator did for the very same requests (matched by `x-request-id`): its TTFT (arrival →
    first token's step) and TPOT (first → last token's step, over N − 1). The nominal step
    time is printed too (TPOT is above it when other requests' prefill joins a step).
(b) GuideLLM's mock server (`guidellm mock-server`, written by the vLLM project, not by us),
    with a fixed configured TTFT and inter-token latency. The reference is the configured
    value. Its timing is relative `asyncio.sleep` per token, so it runs a little slow by its
    own design (each sleep wakes up to ~1 ms late); the output says so.

GuideLLM depends on torch and transformers; it is not a fleetctl dependency. Install it, for
measurement only, in a separate virtualenv so the project's stays as it is (the mock server
needs neither torch nor a tokenizer download: without `--processor` it uses a mock tokenizer):

    python3.11 -m venv var/compare-venv
    var/compare-venv/bin/pip install --no-deps guidellm==0.8.1
    var/compare-venv/bin/pip install click~=8.4.0 culsans~=0.10.0 eval_type_backport faker \\
        ftfy 'httpx[http2]<1' loguru msgpack 'numpy>=2' protobuf 'pydantic>=2.11.7' \\
        pydantic-settings pyyaml rich sanic tabulate transformers uvloop \\
        'more-itertools>=10.8' 'typing-extensions>=4.15' 'websockets>=13' datasets

Prints figures; asserts nothing. Usage:

    .venv/bin/python benchmarks/bench_accuracy.py [--levels 1,8,32] [--window 6] \\
        [--guidellm var/compare-venv/bin/guidellm]
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

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks._sim import start_simulator as start  # noqa: E402
from fleetctl.bench.runner import Endpoint, LevelPlan, LevelResult, run_level  # noqa: E402
from fleetctl.core.ports import free_port  # noqa: E402

MODEL = "llama-3.1-8b-instruct"
STEP_MS = 20.0
PACED_PROFILE = f"""
[profiles.paced]
base = "h200"
description = "simulated, paced for accuracy checks"
decode_base_ms = {STEP_MS}
decode_per_seq_ms = 0.0
prefill_tokens_per_s = 20000.0
network_latency_ms = 0.0
divergence_rate = 0.0
max_seqs = 512
max_waiting = 4096
kv_cache_tokens = 2000000
prefix_cache_tokens = 16384
"""
MOCK_TTFT_MS = 200.0
MOCK_ITL_MS = 40.0


@dataclass(frozen=True)
class Row:
    prompt_tokens: int
    completion_tokens: int
    arrival_s: float = 0.0
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    prefix_group: str | None = None
    prefix_tokens: int = 0
    latency_class: str | None = None


TRACE = [Row(400, 48), Row(800, 64), Row(200, 32), Row(600, 56)]


# ---- servers ----------------------------------------------------------------------------------


def start_simulator(profiles: str, pool: str, *extra: str) -> tuple[subprocess.Popen[str], str]:
    """`python -m fleetctl.sim` with one pool `pool` from `profiles` (TOML text) on a free port."""
    folder = Path(tempfile.mkdtemp(prefix="bench-sim-"))
    (folder / "profiles.toml").write_text(profiles)
    return start(folder / "profiles.toml", "--pool", f"{pool}={pool}@0", *extra,
                 log_level="WARNING")


def start_guidellm_mock(guidellm: str, ttft_ms: float, itl_ms: float
                        ) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [guidellm, "mock-server", "--host", "127.0.0.1", "--port", str(port), "--model", MODEL,
         "--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), "--output-tokens", "100000"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "GUIDELLM_MOCK_SERVER_LOG_REQUEST_RECEIVED": "false"},
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/health", timeout=1)
            return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("guidellm mock-server did not start")


def stop(proc: subprocess.Popen[Any]) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()


def ground_truth(url: str) -> dict[str, dict[str, Any]]:
    records: dict[str, dict[str, Any]] = {}
    since = 0
    while True:
        page = httpx.get(f"{url}/admin/ground-truth", timeout=30,
                         params={"kind": "requests", "since": since, "limit": 2000}).json()
        if not page["requests"]:
            return records
        records.update({r["request_id"]: r for r in page["requests"]})
        since = page["next_since"]


# ---- measuring ----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, concurrency: int, window_s: float, prefix: str,
            server_pid: int) -> tuple[LevelResult, float]:
    """One level; also the server process's CPU share over it."""
    plan = LevelPlan(warmup_s=1.0, window_s=window_s, min_samples=max(10, 2 * concurrency),
                     max_duration_s=60.0, request_timeout_s=60.0)
    cpu0 = cpu_seconds(server_pid)
    level = asyncio.run(run_level(Endpoint(url, MODEL), TRACE, plan, concurrency=concurrency,
                                  request_id_prefix=prefix))
    return level, (cpu_seconds(server_pid) - cpu0) / level.wall_s


def measured_ok(level: LevelResult) -> list[Any]:
    return [r for r in level.results if r.status == "ok" and not r.warmup]


def pct_error(measured: float, reference: float) -> float:
    return (measured / reference - 1) * 100


def row(label: str, n: int, ttft: float, ttft_ref: float, tpot: float, tpot_ref: float,
        note: str = "") -> dict[str, Any]:
    e1, e2 = pct_error(ttft, ttft_ref), pct_error(tpot, tpot_ref)
    ok = "yes" if abs(e1) <= 5 and abs(e2) <= 5 else "NO"
    print(f"{label:>7} {n:>5}  {ttft * 1e3:8.2f} {ttft_ref * 1e3:8.2f} {e1:+6.2f}%  "
          f"{tpot * 1e3:7.3f} {tpot_ref * 1e3:7.3f} {e2:+6.2f}%  {ok:>4}  {note}")
    return {"streams": label, "n": n, "ttft_err_pct": e1, "tpot_err_pct": e2}


HEADER = ("streams     n  TTFT p50 ms (ref)   error   TPOT p50 ms (ref)  error  ≤5%")


def bench_simulator(levels: list[int], window_s: float) -> None:
    print(f"\n(a) fleetctl sim, profile paced: step {STEP_MS:g} ms, prefill 20,000 tok/s, "
          "network 0; reference = the simulator's ground truth for the same requests")
    proc, url = start_simulator(PACED_PROFILE, "paced", "--record-ground-truth",
                                "--ground-truth-size", "20000")
    try:
        print(HEADER)
        for c in levels:
            httpx.delete(f"{url}/admin/ground-truth")
            level, server_cpu = measure(url, c, window_s, f"acc-sim-{c}", proc.pid)
            truth = ground_truth(url)
            ok = [r for r in measured_ok(level) if r.request_id in truth]
            gt = [truth[r.request_id] for r in ok]
            gt_tpot = [(g["token_times_mono"][-1] - g["token_times_mono"][0])
                       / (g["completion_tokens"] - 1) for g in gt]
            # Where a TTFT difference comes from: before the server's handler started
            # (client send path + the server's HTTP queue), or after its first chunk was written.
            send = statistics.median(g["arrival_mono"] - level.origin - r.started_at
                                     for r, g in zip(ok, gt, strict=True))
            recv = statistics.median(level.origin + r.first_token_at - g["token_written_mono"][0]
                                     for r, g in zip(ok, gt, strict=True))
            row(str(c), len(ok), statistics.median(r.ttft_s for r in ok),
                statistics.median(g["ttft_s"] for g in gt),
                statistics.median(r.tpot_s for r in ok), statistics.median(gt_tpot),
                f"send→handler {send * 1e3:.2f} ms, written→read {recv * 1e3:.2f} ms; "
                f"CPU client {level.client_cpu_share:.0%} server {server_cpu:.0%}")
    finally:
        stop(proc)


def bench_guidellm(guidellm: str, levels: list[int], window_s: float) -> None:
    if not Path(guidellm).exists():
        print(f"\n(b) skipped: {guidellm} not found (see this script's docstring)")
        return
    print(f"\n(b) GuideLLM mock-server (vLLM project), configured TTFT {MOCK_TTFT_MS:g} ms, "
          f"ITL {MOCK_ITL_MS:g} ms; reference = the configured values")
    proc, url = start_guidellm_mock(guidellm, MOCK_TTFT_MS, MOCK_ITL_MS)
    try:
        print(HEADER)
        for c in levels:
            level, server_cpu = measure(url, c, window_s, f"acc-mock-{c}", proc.pid)
            ok = measured_ok(level)
            itl = statistics.median(g for r in ok for g in r.itl_s)
            row(str(c), len(ok), statistics.median(r.ttft_s for r in ok), MOCK_TTFT_MS / 1e3,
                statistics.median(r.tpot_s for r in ok), MOCK_ITL_MS / 1e3,
                f"ITL p50 {itl * 1e3:.3f} ms; "
                f"CPU client {level.client_cpu_share:.0%} server {server_cpu:.0%}")
    finally:
        stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--window", type=float, default=6.0, help="steady-state seconds")
    parser.add_argument("--guidellm", default=str(REPO / "var/compare-venv/bin/guidellm"))
    parser.add_argument("--only", choices=["sim", "guidellm"])
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    print(f"bench_accuracy: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} "
          "(client, server and anything else share them)")
    if args.only != "guidellm":
        bench_simulator(levels, args.window)
    if args.only != "sim":
        bench_guidellm(args.guidellm, levels, args.window)


if __name__ == "__main__":
    main()
