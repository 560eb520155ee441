"""How fast does fleetctl read a trace?

Writes a generated 500,000-line fleetctl trace (Poisson arrivals, lognormal lengths, shared
prefix groups and latency classes on every line) to a temporary file, then reads it back with
`parse_jsonl` from a file opened in binary mode, five times, and prints the median lines/s.
It does the same with the standard-library JSON decoder (the fallback when pydantic-core is
not installed), and for Mooncake and Azure files converted from the same requests.

Prints figures; asserts nothing. Usage:

    .venv/bin/python benchmarks/trace_parse.py [--lines 500000] [--runs 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from fleetctl.bench import traces  # noqa: E402
from fleetctl.bench.traces import Arrival, Dist, TraceStream  # noqa: E402

TARGET_LINES_PER_S = 200_000


def write_traces(directory: Path, lines: int) -> dict[str, Path]:
    requests = list(traces.generate(
        n=lines, seed=42, prompt_tokens=Dist.lognormal(900, 1.0, lo=16, hi=32_000),
        completion_tokens=Dist.lognormal(180, 0.8, hi=4096), arrival=Arrival.poisson(60.0),
        shared_prefix_groups=16, shared_prefix_tokens=512, latency_class="interactive"))
    paths = {"fleetctl": directory / "trace.jsonl", "mooncake": directory / "mooncake.jsonl",
             "azure-csv": directory / "azure.csv"}
    with open(paths["fleetctl"], "wb") as fp:
        traces.write_jsonl(requests, fp)
    with open(paths["mooncake"], "w") as fp:
        for i, r in enumerate(requests):
            blocks = -(-r.prompt_tokens // 512)
            hash_ids = [1_000_000 + i * 100 + b for b in range(blocks)]
            fp.write(json.dumps({"timestamp": round(r.arrival_s * 1000),
                                 "input_length": r.prompt_tokens,
                                 "output_length": r.completion_tokens,
                                 "hash_ids": hash_ids}) + "\n")
    start = datetime(2023, 11, 16, 18, 15, 46, 680590)
    with open(paths["azure-csv"], "w") as fp:
        fp.write(traces.AZURE_HEADER + "\n")
        for r in requests:
            stamp = (start + timedelta(seconds=r.arrival_s)).strftime("%Y-%m-%d %H:%M:%S.%f")
            fp.write(f"{stamp}0,{r.prompt_tokens},{r.completion_tokens}\n")
    return paths


def lines_per_s(path: Path, parse: Callable[..., TraceStream],
                runs: int) -> tuple[list[float], list[float]]:
    """Lines per wall-clock second and per CPU second of this process, one of each per run.
    On a shared machine the CPU figure shows the parser's own cost."""
    wall, cpu = [], []
    for _ in range(runs):
        with open(path, "rb") as fp:
            started, started_cpu = time.perf_counter(), time.process_time()
            count = sum(1 for _ in parse(fp))
            wall.append(count / (time.perf_counter() - started))
            cpu.append(count / (time.process_time() - started_cpu))
    return wall, cpu


def report(name: str, rates: tuple[list[float], list[float]], target: bool = False) -> None:
    wall, cpu = rates
    median = statistics.median(wall)
    verdict = ""
    if target:
        verdict = "  PASS" if median >= TARGET_LINES_PER_S else "  BELOW TARGET"
    print(f"{name:44s} {median:>9,.0f} lines/s median (runs {min(wall):,.0f} … "
          f"{max(wall):,.0f}; {statistics.median(cpu):,.0f} per CPU-s){verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=500_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        paths = write_traces(Path(tmp), args.lines)
        size_mb = paths["fleetctl"].stat().st_size / 1e6
        print(f"{args.lines:,} lines, {size_mb:.1f} MB fleetctl trace; JSON decoder: "
              f"{traces.JSON_DECODER}; target {TARGET_LINES_PER_S:,} lines/s; "
              f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        report("parse_jsonl (fleetctl format)",
               lines_per_s(paths["fleetctl"], traces.parse_jsonl, args.runs), target=True)
        fast = traces.reading._fast_loads
        traces.reading._fast_loads = traces.reading._stdlib_loads
        try:
            report("parse_jsonl, standard-library json decoder",
                   lines_per_s(paths["fleetctl"], traces.parse_jsonl, args.runs))
        finally:
            traces.reading._fast_loads = fast
        report("parse_mooncake", lines_per_s(paths["mooncake"], traces.parse_mooncake, args.runs))
        report("parse_azure_csv",
               lines_per_s(paths["azure-csv"], traces.parse_azure_csv, args.runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
