"""`fleetctl bench traces | upload | generate | run | show`: benchmark a trace against pools
and read each pool's highest SLO-passing concurrency (or, with `--speeds`, the highest
trace speed) and its cost per 1M output tokens."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from fleetctl.bench import traces
from fleetctl.cli.client import ApiClient, CliError
from fleetctl.cli.output import print_answer, print_fields, print_json, print_table

ACTIVE = ("queued", "running")
SOURCES = ("auto", "fleetctl", "mooncake", "azure-csv")
ARRIVALS = ("poisson", "constant", "bursty")
BAR_WIDTH = 20


def _client(args: argparse.Namespace) -> ApiClient:
    return ApiClient.from_env(args.url, args.token)


# --- traces ----------------------------------------------------------------------------------

def cmd_traces(args: argparse.Namespace) -> int:
    traces = _client(args).get_all("/api/v1/bench/traces/")
    if args.json:
        print_json(traces)
        return 0
    print_table(["name", "source", "requests", "duration s", "rate/s", "by", "created"],
                [[t["name"], t["source"], t["requests"], f"{t['duration_s']:.1f}",
                  _num(t["summary"].get("mean_request_rate_per_s"), "{:.2f}"),
                  t["created_by"], t["created_at"]] for t in traces])
    return 0


def _num(value: Any, fmt: str) -> str:
    return "—" if value is None else fmt.format(value)


def _trace_line(trace: dict[str, Any]) -> str:
    return (f"trace {trace['name']}: {trace['requests']:,} requests over "
            f"{trace['duration_s']:.1f} s ({trace['source']})")


def cmd_upload(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise CliError(f"{args.file}: no such file", 2)
    client = _client(args)
    with path.open("rb") as fp:
        # httpx streams the file object in chunks; the server reads it line by line.
        trace = client._send("POST", "/api/v1/bench/traces/",
                             data={"name": args.name, "description": args.description,
                                   "source": args.source},
                             files={"file": (path.name, fp, "application/octet-stream")})
    print_answer(trace, args.json, _trace_line)
    return 0


def length_spec(text: str) -> Any:
    try:
        return traces.length_spec(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def cmd_generate(args: argparse.Namespace) -> int:
    arrival: dict[str, Any] = {"kind": args.arrival, "rate": args.rate}
    if args.arrival == "bursty":
        arrival["burstiness"] = args.burstiness
    body = {"name": args.name, "description": args.description, "n": args.n,
            "seed": args.seed, "prompt_tokens": args.prompt_tokens,
            "completion_tokens": args.completion_tokens, "arrival": arrival,
            "shared_prefix_groups": args.shared_prefix_groups,
            "shared_prefix_tokens": args.shared_prefix_tokens,
            "latency_class": args.latency_class}
    trace = _client(args).post("/api/v1/bench/traces/generate/", body)
    print_answer(trace, args.json, _trace_line)
    return 0


# --- runs ------------------------------------------------------------------------------------

def levels_arg(text: str) -> list[int]:
    levels = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a whole number ≥ 1; write levels as 1,4,16,64")
        levels.append(int(part))
    return levels


def speeds_arg(text: str) -> list[float]:
    speeds = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = float(part)
        except ValueError:
            value = float("nan")
        if not 0 < value <= 1000:  # NaN fails too
            raise argparse.ArgumentTypeError(
                f"{part!r} is not a speed > 0 and ≤ 1000; write speeds as 0.5,1,2 "
                "(1 = the trace's own timing)")
        speeds.append(value)
    return speeds


def _load(level: dict[str, Any]) -> str:
    speed = level.get("speed")
    return f"{speed:g}×" if speed is not None else str(level["concurrency"])


def progress_line(run: dict[str, Any]) -> str:
    """`run 12: running [#####-----] 3/8 levels · paced at concurrency 4`."""
    progress = run["progress"]
    done, planned = progress["levels_done"], progress["levels_planned"]
    if planned:
        filled = round(BAR_WIDTH * min(done, planned) / planned)
        bar = f"[{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {done}/{planned} levels"
    else:
        bar = f"{done} level{'s' if done != 1 else ''} done (search)"
    doing = f" · {progress['doing']}" if progress["doing"] else ""
    return f"run {run['id']}: {run['status']} {bar}{doing}"


def follow(client: ApiClient, run: dict[str, Any], quiet: bool, every_s: float = 1.0
           ) -> dict[str, Any]:
    """Poll the run, rewriting one progress line on a terminal, until it ends."""
    tty = sys.stderr.isatty()
    last = ""
    for run in client.polled(run, f"/api/v1/bench/runs/{run['id']}/",
                             lambda run: run["status"] in ACTIVE, every_s):
        line = progress_line(run)
        if not quiet and run["status"] in ACTIVE and (tty or line != last):
            print(line.ljust(78), end="\r" if tty else "\n", file=sys.stderr, flush=True)
            last = line
    if not quiet:
        print(progress_line(run).ljust(78), file=sys.stderr)
    return run


def _cost(result: dict[str, Any]) -> str:
    cost = result["cost_per_1m"]
    return f"{cost} {result['currency']}" if cost is not None else "—"


def print_results(run: dict[str, Any]) -> None:
    trace_timing = run.get("timing") == "trace"
    print_table(
        ["pool", "highest passing speed" if trace_timing else "highest passing conc.",
         "output tok/s", "binding", "cost per 1M out", "note"],
        [[r["pool"], _num(r.get("best_speed"), "{:g}×") if trace_timing
          else _num(r["best_concurrency"], "{}"),
          _num(r["output_tokens_per_s"], "{:,.1f}"), r["binding"] or "—", _cost(r),
          ("client-bound; " if r["client_bound"] else "") + (r["note"] or "")]
         for r in run["results"]])


def _report(run: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print_json(run)
    else:
        print_results(run)
        line = f"run {run['id']}: {run['status']}"
        if run["error"]:
            line += f" ({run['error']})"
        print(line)
    return 0 if run["status"] == "complete" else 1


def cmd_run(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {
        "trace": args.trace, "pools": args.pool, "model_id": args.model,
        "slo_ttft_p95_ms": args.ttft_p95_ms, "slo_tpot_p95_ms": args.tpot_p95_ms,
        "slo_error_rate": args.error_rate, "shards": args.shards, "name": args.name,
    }
    if args.speeds:
        body |= {"timing": "trace", "speeds": args.speeds}
    elif args.levels:
        body |= {"mode": "levels", "levels": args.levels,
                 "max_concurrency": max(args.max_concurrency or 0, max(args.levels), 256)}
    else:
        body |= {"mode": "search", "max_concurrency": args.max_concurrency or 256}
    for key in ("warmup_s", "window_s", "ramp_s", "min_samples", "lag_limit_ms"):
        if getattr(args, key) is not None:
            body[key] = getattr(args, key)
    client = _client(args)
    run = client.post("/api/v1/bench/runs/", body)
    if not args.json:
        print(f"started run {run['id']}: {client.base_url}{run['url']}", file=sys.stderr)
    if args.no_wait:
        if args.json:
            print_json(run)
        return 0
    return _report(follow(client, run, args.json), args.json)


def cmd_show(args: argparse.Namespace) -> int:
    run = _client(args).get(f"/api/v1/bench/runs/{args.run_id}/")
    if args.json:
        print_json(run)
        return 0
    if run.get("timing") == "trace":
        sweep = "trace timing at speeds " + ", ".join(f"{x:g}×" for x in run["speeds"])
    elif run["mode"] == "levels":
        sweep = f"levels {', '.join(map(str, run['levels']))}"
    else:
        sweep = f"search up to {run['max_concurrency']}"
    print_fields([
        ("run", f"{run['id']} {run['name']}".strip()), ("status", run["status"]),
        ("trace", run["trace"]), ("pools", ", ".join(run["pools"])),
        ("model", run["model_id"]), ("sweep", sweep),
        ("SLO", f"TTFT p95 ≤ {run['slo_ttft_p95_ms']:g} ms, TPOT p95 ≤ "
                f"{run['slo_tpot_p95_ms']:g} ms, errors ≤ {run['slo_error_rate']:g}"),
        ("progress", progress_line(run)), ("error", run["error"]),
    ])
    print()
    print_results(run)
    print()
    load = "speed" if run.get("timing") == "trace" else "conc."
    print_table(["pool", load, "verdict", "tok/s", "ttft p95 ms", "tpot p95 ms", "errors",
                 "cost/1M", "reason"],
                [[lv["pool"], _load(lv), lv["verdict"],
                  _num(lv["output_tokens_per_s"], "{:,.1f}"), _num(lv["ttft_p95_ms"], "{:.0f}"),
                  _num(lv["tpot_p95_ms"], "{:.1f}"), _num(lv["error_rate"], "{:.3f}"),
                  lv["cost_per_1m"] or "—", lv["note"]] for lv in run["level_rows"]])
    return 0


def _positive_int(value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number ≥ 1")
    return int(value)


def _number(value: str) -> float:
    try:
        return float(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from exc


def _seconds(value: str) -> float:
    number = _number(value)
    if not math.isfinite(number) or number < 0:
        raise argparse.ArgumentTypeError(f"{value!r}: give seconds, a number >= 0")
    return number


def add_commands(sub: Any, common: Any) -> None:
    bench = sub.add_parser("bench", help="benchmark traces against pools (cost per 1M tokens)")
    bench_sub = bench.add_subparsers(dest="bench_command", metavar="ACTION", required=True)
    _add_trace_commands(bench_sub, common)
    _add_run_commands(bench_sub, common)


def _add_trace_commands(bench_sub: Any, common: Any) -> None:
    traces = bench_sub.add_parser("traces", help="list the stored traces")
    common(traces)
    traces.set_defaults(func=cmd_traces)

    upload = bench_sub.add_parser("upload", help="upload a trace file (token scope `jobs`)")
    upload.add_argument("file", help="fleetctl JSONL, Mooncake JSONL or Azure CSV")
    upload.add_argument("--name", required=True)
    upload.add_argument("--source", choices=SOURCES, default="auto")
    upload.add_argument("--description", default="")
    common(upload)
    upload.set_defaults(func=cmd_upload)

    gen = bench_sub.add_parser("generate", help="generate a synthetic trace (scope `jobs`)")
    gen.add_argument("--name", required=True)
    gen.add_argument("--n", type=_positive_int, default=1000, help="requests (default 1000)")
    gen.add_argument("--rate", type=_number, default=10.0, help="requests/s (default 10)")
    gen.add_argument("--arrival", choices=ARRIVALS, default="poisson")
    gen.add_argument("--burstiness", type=_number, default=1.0,
                     help="bursty: 1 is Poisson, < 1 burstier")
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--prompt-tokens", type=length_spec, default=512,
                     help="a number, a range 64-512, or JSON (default 512)")
    gen.add_argument("--completion-tokens", type=length_spec, default=128,
                     help="a number, a range 16-256, or JSON (default 128)")
    gen.add_argument("--shared-prefix-groups", type=int, default=0)
    gen.add_argument("--shared-prefix-tokens", type=int, default=0)
    gen.add_argument("--latency-class", choices=("interactive", "standard", "batch"))
    gen.add_argument("--description", default="")
    common(gen)
    gen.set_defaults(func=cmd_generate)


def _add_run_commands(bench_sub: Any, common: Any) -> None:
    run = bench_sub.add_parser("run", help="benchmark pools on a trace and wait for the result")
    run.add_argument("--trace", required=True)
    run.add_argument("--pool", required=True, action="append",
                     help="repeat to compare pools side by side")
    run.add_argument("--model", required=True)
    run.add_argument("--ttft-p95-ms", type=_number, required=True)
    run.add_argument("--tpot-p95-ms", type=_number, required=True)
    run.add_argument("--error-rate", type=_number, required=True, help="e.g. 0.01")
    sweep = run.add_mutually_exclusive_group()
    sweep.add_argument("--levels", type=levels_arg, help="fixed levels, e.g. 1,4,16,64")
    sweep.add_argument("--max-concurrency", type=_positive_int,
                       help="search up to this (default 256)")
    sweep.add_argument("--speeds", type=speeds_arg,
                       help="replay at the trace's own timing scaled by each speed, e.g. "
                            "0.5,1,2 (implies trace timing)")
    run.add_argument("--shards", type=_positive_int, default=1,
                     help="client processes per level (bench workers)")
    run.add_argument("--warmup-s", type=_number,
                     help="seconds per level before the window (server default 15)")
    run.add_argument("--window-s", type=_number,
                     help="steady-state seconds per level (server default 60)")
    run.add_argument("--ramp-s", type=_seconds,
                     help="spread each level's stream starts over this many seconds, at most "
                          "the warm-up (default half the warm-up)")
    run.add_argument("--min-samples", type=_positive_int)
    run.add_argument("--lag-limit-ms", type=_number)
    run.add_argument("--name", default="")
    run.add_argument("--no-wait", action="store_true", help="return once started")
    common(run)
    run.set_defaults(func=cmd_run)

    show = bench_sub.add_parser("show", help="a run's results per pool and its levels")
    show.add_argument("run_id", type=int)
    common(show)
    show.set_defaults(func=cmd_show)


__all__ = ["add_commands"]
