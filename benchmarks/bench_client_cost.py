"""What does the benchmark runner cost, and how many streams can one client process drive?

Starts one simulator process (profile `fast`: steps of 20 + 0.04·b ms, room for 1,024
sequences, no network delay) and runs the runner in this process at rising fixed concurrency
(default 64, 128, 256, 384, 512 streams; completions of 96–160 tokens, `ignore_eos`). Per level:

- client CPU-ms per streamed output token = process CPU time of this process over the level /
  output tokens received over the level (target ≤ 0.15);
- client CPU share, event-loop lag p99 and schedule lag p99, and whether the level would be
  marked invalid by `stats.verdict` (lag p99 > 10 ms, or `--lag-limit-ms`; CPU > 85 % of a
  core);
- the simulator's CPU share and output tokens/s (so a slow server is not blamed on the client).

The answer is the highest level that is still valid (target ≥ 256 streams). Both processes
share the machine's cores with anything else running; the load average is printed.

Prints figures; asserts nothing. Usage:

    .venv/bin/python benchmarks/bench_client_cost.py [--levels 64,128,256,384,512] [--window 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_accuracy import MODEL, Row, cpu_seconds, start_simulator, stop  # noqa: E402

from fleetctl.bench.runner import Endpoint, LevelPlan, run_level  # noqa: E402
from fleetctl.bench.stats import Slo, summarize, verdict  # noqa: E402

FAST_PROFILE = """
[profiles.fast]
base = "h200"
description = "simulated, sized for client-cost measurement"
max_seqs = 1024
max_waiting = 8192
kv_cache_tokens = 4000000
prefix_cache_tokens = 200000
decode_base_ms = 20.0
decode_per_seq_ms = 0.04
network_latency_ms = 0.0
divergence_rate = 0.0
"""
LAG_LIMIT_S = 0.010
CPU_LIMIT = 0.85
# Varied lengths (96–160 tokens), so streams do not finish, and resend, in lock-step.
TRACE = [Row(32 + 7 * i % 48, 96 + 13 * i % 65) for i in range(64)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="64,128,256,384,512")
    parser.add_argument("--window", type=float, default=5.0)
    parser.add_argument("--lag-limit-ms", type=float, default=LAG_LIMIT_S * 1000,
                        help="invalid above this loop/schedule lag p99 (runs default to 25)")
    args = parser.parse_args()
    lag_limit_s = args.lag_limit_ms / 1000
    print(f"bench_client_cost: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
    proc, url = start_simulator(FAST_PROFILE, "fast")
    best = best_by_cpu = None
    print("streams  tokens  CPU-ms/token  client CPU  loop lag p99  sched lag p99  valid"
          "  server CPU  tokens/s")
    try:
        for c in (int(x) for x in args.levels.split(",")):
            plan = LevelPlan(warmup_s=2.0, window_s=args.window, min_samples=1,
                             max_duration_s=120.0, request_timeout_s=120.0)
            sim_cpu0 = cpu_seconds(proc.pid)
            level = asyncio.run(run_level(Endpoint(url, MODEL), TRACE, plan, concurrency=c))
            sim_share = (cpu_seconds(proc.pid) - sim_cpu0) / level.wall_s
            tokens = sum(r.output_tokens for r in level.results)
            summary = summarize(level.samples())
            judged = verdict(summary, Slo(ttft_p95_s=60, tpot_p95_s=10, error_rate=0.5),
                             min_samples=1, lag_limit_s=lag_limit_s, cpu_limit=CPU_LIMIT)
            valid = judged.outcome != "invalid"
            if valid:
                best = c
            if level.client_cpu_share <= CPU_LIMIT:
                best_by_cpu = c
            errors = summary.n_errors + summary.n_timeouts
            print(f"{c:>7} {tokens:>7}  {level.client_cpu_s * 1000 / max(tokens, 1):12.4f}"
                  f"  {level.client_cpu_share:10.0%}  {(summary.loop_lag_p99_s or 0) * 1e3:9.2f} ms"
                  f"  {(summary.schedule_lag_p99_s or 0) * 1e3:10.3f} ms"
                  f"  {'yes' if valid else 'NO':>5}"
                  f"  {sim_share:10.0%}  {summary.output_tokens_per_s:8.0f}"
                  + (f"  ({errors} errors)" if errors else "")
                  + ("" if valid else f"  [{judged.reason}]"))
    finally:
        stop(proc)
    print(f"most streams in one valid level: {best} (limits: lag p99 {lag_limit_s * 1e3:g} ms,"
          f" CPU {CPU_LIMIT:.0%} of a core); by the CPU limit alone: {best_by_cpu}")
    print(f"load average now {os.getloadavg()[0]:.2f}: a loop lag far above what the client's"
          " own CPU share explains means the process waited for a core")


if __name__ == "__main__":
    main()
