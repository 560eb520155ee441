"""`fleetctl ramp`: guarded ramps — start one, follow it, pause, resume, skip or abort it.
`fleetctl ramp --route R --weights …` (no subcommand) still sets a split at once, as it
always did; `fleetctl split` is the same."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fleetctl.cli import traffic
from fleetctl.cli.client import ApiClient, CliError
from fleetctl.cli.output import (
    non_negative,
    print_answer,
    print_fields,
    print_json,
    print_table,
    show_answer,
)
from fleetctl.cli.telemetry import figure_text

# Exit codes of `ramp start --wait` (and `ramp status --wait`): how the ramp ended.
EXIT_BY_STATE = {"complete": 0, "rolled-back": 3, "aborted": 3, "failed": 3, "paused": 4}
FOLLOW_EVERY_S = 2.0


def _client(args: argparse.Namespace) -> ApiClient:
    return ApiClient.from_env(args.url, args.token)


def parse_steps(text: str) -> list[dict[str, Any]]:
    """"1:60,5:60,10:120" → [{"percent": 1, "hold_s": 60}, …] (percent:hold seconds). The
    last percent may be "capacity": the server resolves it to the pool's capacity share."""
    steps: list[dict[str, Any]] = []
    parts = text.split(",")
    for i, part in enumerate(parts, start=1):
        percent, sep, hold = part.strip().partition(":")
        try:
            if not sep:
                raise ValueError
            if percent.strip().lower() == "capacity" and i == len(parts):
                steps.append({"percent": "capacity", "hold_s": float(hold)})
                if steps[-1]["hold_s"] <= 0:
                    raise ValueError
                continue
            steps.append({"percent": float(percent), "hold_s": float(hold)})
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{part.strip()!r}: write steps as percent:hold_seconds,…, e.g. "
                f"1:60,5:60,10:120 (1 % for 60 s, then 5 % for 60 s, then 10 % for 120 s)"
            ) from None
        if not 0 < steps[-1]["percent"] <= 100 or steps[-1]["hold_s"] <= 0:
            raise argparse.ArgumentTypeError(
                f"{part.strip()!r}: a percent above 0 and at most 100, held a positive number "
                f"of seconds")
    numbers = [s["percent"] for s in steps if s["percent"] != "capacity"]
    if numbers != sorted(set(numbers)):
        raise argparse.ArgumentTypeError(
            f"{text!r}: the percents must strictly increase (each step raises the weight)")
    return steps


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:g} %"


def _summary(ramp: dict[str, Any]) -> str:
    step = ramp["step_index"]
    at = (f"step {step + 1}/{len(ramp['steps'])} at {_percent(ramp['current_percent'])}"
          if step >= 0 else "no step set yet")
    reason = f" ({ramp['state_reason']})" if ramp.get("state_reason") else ""
    return f"ramp {ramp['id']} of {ramp['pool']} on {ramp['route']}: {ramp['state']}, {at}{reason}"


def _event_line(event: dict[str, Any]) -> str:
    percent = f" {event['percent']:g} %" if event.get("percent") is not None else ""
    return f"{event['at']}  {event['kind']:<13}{percent}  {event['actor']}: {event['message']}"


def _side(numbers: dict[str, Any], side: str) -> list[list[str]]:
    stats = numbers.get(side)
    if not stats:
        return []
    rows = [[f"{side} {stats.get('pool', '')}", "requests", str(stats.get("requests", 0)), ""],
            ["", "client disconnects", str(stats.get("client_disconnects", 0)),
             "abandoned by the client: not counted against the pool"]]
    for label, key, unit in (("error rate", "error_rate", "rate"), ("TTFT p95", "ttft_p95", "ms"),
                             ("TPOT p95", "tpot_p95", "ms")):
        figure = stats.get(key) or {}
        rows.append(["", label, figure_text(figure, unit), figure.get("source", "")])
    return rows


def print_ramp(ramp: dict[str, Any]) -> None:
    print_fields([
        ("ramp", ramp["id"]), ("route", ramp["route"]), ("pool", ramp["pool"]),
        ("plan", ramp["plan"]), ("state", f"{ramp['state']} {ramp['state_reason']}".strip()),
        ("step", _summary(ramp).split(": ", 1)[1]),
        ("thresholds", f"TTFT p95 ≤ {ramp['slo_ttft_p95_ms']:g} ms, TPOT p95 ≤ "
                       f"{ramp['slo_tpot_p95_ms']:g} ms, errors ≤ "
                       f"{ramp['slo_error_rate'] * 100:g} %, at most "
                       f"{ramp['latency_margin_pct']:g} % slower than the primary"),
        ("guard", f"{ramp['min_samples']} samples in {ramp['window_s']} s, rollback after "
                  f"{ramp['failure_threshold']} failing check(s)"),
        ("drain", ramp["drain"]), ("started", f"{ramp['created_at']} by {ramp['created_by']}"),
        ("finished", ramp["finished_at"]),
    ])
    spans = {span["step"]: span for span in ramp.get("spans", [])}
    print()
    print_table(["step", "percent", "hold s", "outcome"],
                [[i + 1, _percent(step["percent"]), f"{step['hold_s']:g}",
                  spans[i]["outcome"] if i in spans else "pending"]
                 for i, step in enumerate(ramp["steps"])])
    numbers = ramp.get("numbers")
    print()
    if numbers:
        print(f"guard now: {numbers['decision']} — " + "; ".join(numbers.get("reasons") or []))
        print_table(["pool", "figure", "value", "source"],
                    _side(numbers, "candidate") + _side(numbers, "primary"))
    else:
        print("guard now: — (no step is holding)")
    print()
    print("timeline:")
    for event in ramp.get("events", []):
        print("  " + _event_line(event))


def _follow(client: ApiClient, ramp: dict[str, Any], quiet: bool) -> dict[str, Any]:
    """Print each new event until the ramp is no longer running."""
    seen = 0
    for ramp in client.polled(ramp, f"/api/v1/ramps/{ramp['id']}/",
                              lambda ramp: ramp["state"] == "running", FOLLOW_EVERY_S):
        events = ramp.get("events", [])
        if not quiet:
            for event in events[seen:]:
                print(_event_line(event), file=sys.stderr, flush=True)
        seen = len(events)
    return ramp


def _ended(ramp: dict[str, Any], as_json: bool) -> int:
    print_answer(ramp, as_json, _summary)
    return EXIT_BY_STATE.get(ramp["state"], 1)


def cmd_ramp(args: argparse.Namespace) -> int:
    """`fleetctl ramp` with no subcommand: the old set-a-split-at-once form."""
    missing = [flag for flag, value in (("--route", args.route), ("--weights", args.weights),
                                        ("--reason", args.reason)) if not value]
    if missing:
        raise CliError(
            "fleetctl ramp: give a subcommand (start, status, pause, resume, skip, abort) or, "
            f"to set a split at once, --route, --weights and --reason (missing: "
            f"{', '.join(missing)}); see `fleetctl ramp --help`.", 2)
    return traffic.cmd_split(args)


def cmd_start(args: argparse.Namespace) -> int:
    client = _client(args)
    body: dict[str, Any] = {
        "route": args.route, "pool": args.pool, "steps": args.steps, "reason": args.reason,
        "min_samples": args.min_samples, "window_s": args.window_s,
        "failure_threshold": args.failure_threshold, "plan": args.plan,
        "slo_ttft_p95_ms": args.slo_ttft_ms, "slo_tpot_p95_ms": args.slo_tpot_ms,
        "slo_e2e_p95_ms": args.slo_e2e_ms,
        "slo_error_rate": args.slo_error_rate, "latency_margin_pct": args.latency_margin_pct,
    }
    ramp = client.post("/api/v1/ramps/", {k: v for k, v in body.items() if v is not None},
                       idempotent=True)
    if not args.wait:
        print_answer(ramp, args.json, _summary)
        return 0
    if not args.json:
        print(_summary(ramp), file=sys.stderr)
    return _ended(_follow(client, ramp, args.json), args.json)


def _ramp_id(client: ApiClient, args: argparse.Namespace) -> int:
    if args.id is not None:
        return int(args.id)
    rows = client.get("/api/v1/ramps/", {"route": args.route, "page_size": 1})["results"]
    if not rows:
        raise CliError(f"Route {args.route} has had no ramp.")
    return int(rows[0]["id"])


def cmd_status(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.id is None and not args.route:
        ramps = client.get_all("/api/v1/ramps/", {"state": args.state}, limit=args.limit)
        if args.json:
            print_json(ramps)
            return 0
        print_table(["id", "route", "pool", "state", "step", "percent", "by", "started"],
                    [[r["id"], r["route"], r["pool"], r["state"],
                      f"{r['step_index'] + 1}/{len(r['steps'])}", _percent(r["current_percent"]),
                      r["created_by"], r["created_at"]] for r in ramps])
        return 0
    ramp = client.get(f"/api/v1/ramps/{_ramp_id(client, args)}/")
    show_answer(ramp, args.json, print_ramp)
    return 0


def _action(name: str) -> Any:
    def run(args: argparse.Namespace) -> int:
        client = _client(args)
        ramp = client.post(f"/api/v1/ramps/{args.id}/{name}/", {"reason": args.reason},
                           idempotent=True)
        if args.json:
            print_json(ramp)
        else:
            print(_summary(ramp))
            if ramp.get("drain"):
                print(f"drain {ramp['drain']}: `fleetctl drains` or /traffic/drains/"
                      f"{ramp['drain']}/ for its timing")
        return 0

    return run


def add_commands(sub: Any, common: Any) -> None:
    ramp = sub.add_parser(
        "ramp", help="guarded ramps (start, status, pause, resume, skip, abort); or, with "
                     "--weights, set a split at once like `fleetctl split`",
        description="Guarded ramps: a pool's weight on a route raised step by step, each hold "
                    "judged on live telemetry, rolled back by a drain on a clear failure. "
                    "Without a subcommand, --route/--weights/--reason set a split at once.")
    traffic.split_arguments(ramp, required=False)
    common(ramp)
    ramp.set_defaults(func=cmd_ramp)
    actions = ramp.add_subparsers(dest="ramp_command", metavar="ACTION")

    start = actions.add_parser("start", help="start a guarded ramp (token scope `ramp`)")
    start.add_argument("--route", required=True)
    start.add_argument("--pool", required=True, help="the candidate pool to ramp onto it")
    start.add_argument("--steps", required=True, type=parse_steps,
                       help="percent:hold_seconds,…, e.g. 1:60,5:60,10:120; the last may "
                            "be capacity:120 (the pool's capacity share)")
    start.add_argument("--plan", help="the plan whose candidate the pool is (default: its "
                                      "stage-4 plan listing the route, if any)")
    start.add_argument("--min-samples", type=non_negative(int),
                       help="requests per hold before the guard judges (default 50)")
    start.add_argument("--window-s", type=non_negative(int),
                       help="seconds the guard judges at a time (default 30)")
    start.add_argument("--failure-threshold", type=non_negative(int),
                       help="consecutive failing checks before rollback (default 2)")
    start.add_argument("--slo-ttft-ms", type=non_negative(float), help="TTFT p95 bound (ms)")
    start.add_argument("--slo-tpot-ms", type=non_negative(float), help="TPOT p95 bound (ms)")
    start.add_argument("--slo-e2e-ms", type=non_negative(float),
                       help="whole-answer latency p95 bound (ms), streamed or not")
    start.add_argument("--slo-error-rate", type=non_negative(float),
                       help="error rate bound, 0..1 (e.g. 0.01)")
    start.add_argument("--latency-margin-pct", type=non_negative(float),
                       help="how much slower than the primary the pool may be (%%)")
    start.add_argument("--reason", default="")
    start.add_argument("--wait", action="store_true",
                       help="follow the ramp until it ends: exit 0 complete, 3 rolled back or "
                            "aborted, 4 paused")
    common(start)
    start.set_defaults(func=cmd_start)

    status = actions.add_parser("status", help="a ramp: steps, state, the guard's numbers "
                                               "with their sources, the timeline; or the list")
    status.add_argument("id", nargs="?", type=int, help="ramp id (default: --route's newest)")
    status.add_argument("--route", help="the newest ramp on this route")
    status.add_argument("--state", choices=("running", "paused", "complete", "rolled-back",
                                            "aborted", "failed"), help="list: only these")
    status.add_argument("--limit", type=int, default=20)
    common(status)
    status.set_defaults(func=cmd_status)

    for name, scope, text in (("pause", "ramp", "hold the current step until resumed"),
                              ("resume", "ramp", "carry on from the current step"),
                              ("skip", "ramp", "end the current hold now and step up"),
                              ("abort", "drain", "stop and drain the pool off the route")):
        parser = actions.add_parser(name, help=f"{text} (token scope `{scope}`)")
        parser.add_argument("id", type=int)
        parser.add_argument("--reason", required=True, help="goes in the ramp's timeline")
        common(parser)
        parser.set_defaults(func=_action(name))
