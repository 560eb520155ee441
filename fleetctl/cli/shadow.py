"""`fleetctl shadow start | status | stop | list | export`: shadow a plan's candidate against
its primary on mirrored live traffic (or a replayed trace) and read the verdict against the
noise floor. It talks to the REST API only; sampling and judging happen on the server."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from fleetctl.cli.bench import _positive_int
from fleetctl.cli.client import ApiClient, CliError
from fleetctl.cli.conformance import _run_id
from fleetctl.cli.output import number_in, print_fields, print_json, print_table, row_limit

RUNS = "/api/v1/shadow-runs/"
MODES = ("mirror", "replay")
CONTENT = ("full", "redacted", "off")
STATUSES = ("running", "stopped", "complete", "failed")
FORMATS = ("csv", "json")
DROPS = ("rate", "tokens", "behind", "malformed", "too_large", "stopped", "residency")


class _Client(ApiClient):
    """The API client, also taking an export's file body as it comes (CSV or JSON text)."""

    def _decode(self, response: httpx.Response) -> Any:
        attachment = "attachment" in response.headers.get("content-disposition", "")
        if response.status_code < 400 and attachment:
            return response.text
        return super()._decode(response)


def _client(args: argparse.Namespace) -> _Client:
    client = _Client.from_env(args.url, args.token)
    assert isinstance(client, _Client)
    return client


_percent = number_in(0.01, 100, "give a percentage from 0.01 to 100")
_rate = number_in(0.01, 1000, "give requests per second, 0.01 to 1000")


def _pct(rate: float | None) -> str:
    return "—" if rate is None else f"{rate * 100:.2f}%"


def _points(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.2f}"


def _running_run(client: ApiClient, plan: str) -> dict[str, Any]:
    runs = client.get(RUNS, {"plan": plan, "status": "running"})["results"]
    if not runs:
        raise CliError(f"Plan {plan} has no running shadow run (fleetctl shadow list --plan "
                       f"{plan}).")
    return dict(runs[0])


def _latest_run(client: ApiClient, plan: str) -> dict[str, Any]:
    runs = client.get(RUNS, {"plan": plan, "page_size": 1})["results"]
    if not runs:
        raise CliError(f"Plan {plan} has no shadow run yet (fleetctl shadow start --plan "
                       f"{plan}).")
    return dict(runs[0])


def _counters_line(counters: dict[str, int]) -> str:
    drops = [f"{counters.get(f'dropped_{d}', 0)} {d.replace('_', ' ')}" for d in DROPS
             if counters.get(f"dropped_{d}", 0)]
    refused = counters.get("refused_unauthenticated", 0)
    return (f"{counters.get('received', 0)} received, {counters.get('sampled', 0)} sampled, "
            f"{counters.get('pairs', 0)} pairs ({counters.get('pair_errors', 0)} errors), "
            f"{counters.get('tokens', 0):,} tokens; dropped: {', '.join(drops) or 'none'}"
            + (f"; refused, not from a gateway of the route: {refused}" if refused else ""))


def _summary_fields(run: dict[str, Any]) -> list[tuple[str, Any]]:
    source = (f"route {run['route']}" if run["mode"] == "mirror"
              else f"trace {run['trace']} (route {run['route'] or '—'})")
    fields: list[tuple[str, Any]] = [
        ("run", run["id"]), ("plan", run["plan"]), ("mode", f"{run['mode']}: {source}"),
        ("candidate", run["candidate"]), ("primary", run["primary"]), ("model", run["model"]),
        ("status", run["status"] + (f" ({run['stop_reason']})" if run["stop_reason"] else "")),
        ("verdict", run["verdict"] or "not judged yet"), ("summary", run["summary"]),
        ("sampling", f"{run['sample_percent']}% at most {run['max_rps']} req/s, "
                     f"{run['max_tokens_per_day']:,} tokens/day"),
        ("content", f"{run['content']}, kept {run['retention_hours']} h"),
        ("gate", f"margin {run['margin'] * 100:g} pts, min {run['min_pairs']} pairs, "
                 f"confidence {run['confidence']}"),
    ]
    if "counters" in run:
        fields.append(("counters", _counters_line(run["counters"])))
        fields.append(("evidence", run["evidence_url"]))
        if run["mirror_note"]:  # e.g. the HAProxy gateways whose traffic is not sampled
            fields.append(("mirror", run["mirror_note"]))
    return fields


def print_metrics(judgement: dict[str, Any]) -> None:
    """One line per metric: the noise floor, the candidate, the difference and its bounds."""
    print(f"judged {judgement['at'][:19]} over {judgement['pairs']} pairs:")
    print_table(["metric", "gated", "n", "noise", "candidate", "diff pts", "bound pts",
                 "verdict"],
                [[m["metric"], "yes" if m["gated"] else "no", m["n"], _pct(m["noise_rate"]),
                  _pct(m["signal_rate"]), _points(m["estimate"]),
                  f"[{_points(m['lower'])}, {_points(m['upper'])}]", m["verdict"] or "—"]
                 for m in judgement["metrics"]])


def _report(run: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print_json(run)
        return
    print_fields(_summary_fields(run))
    print()
    if run.get("latest_judgement"):
        print_metrics(run["latest_judgement"])
    else:
        print("(not judged yet: the judge looks every 15 s once pairs arrive)")


def cmd_start(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"plan": args.plan, "mode": args.mode, "route": args.route,
                            "trace": args.trace, "sample_percent": args.percent,
                            "max_rps": args.max_rps, "content": args.content}
    optional = {"max_tokens_per_day": args.max_tokens_per_day,
                "retention_hours": args.retention_hours, "min_pairs": args.min_pairs}
    body.update({k: v for k, v in optional.items() if v is not None})
    client = _client(args)
    run = client.post(RUNS, body)
    if not args.json:
        print(f"started shadow run {run['id']}: {client.base_url}{run['url']}", file=sys.stderr)
        if run["mirror_note"]:
            print(run["mirror_note"], file=sys.stderr)
    _report(run, args.json)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    client = _client(args)
    run_id = args.run_id if args.run_id is not None else _latest_run(client, args.plan)["id"]
    _report(client.get(f"{RUNS}{run_id}/"), args.json)
    return 0


def cmd_stop(args: argparse.Namespace) -> int:
    client = _client(args)
    run_id = args.run_id if args.run_id is not None else _running_run(client, args.plan)["id"]
    run = client.post(f"{RUNS}{run_id}/stop/", {"reason": args.reason})
    if args.json:
        print_json(run)
    else:
        print(f"stopped shadow run {run['id']} of plan {run['plan']}: mirroring off, the "
              f"collector stops sampling within a second")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    params = {"plan": args.plan, "status": args.status, "mode": args.mode,
              "candidate": args.candidate}
    runs = _client(args).get_all(RUNS, params, limit=args.limit)
    if args.json:
        print_json(runs)
        return 0
    print_table(["id", "plan", "mode", "source", "candidate", "status", "verdict", "started",
                 "summary"],
                [[r["id"], r["plan"], r["mode"],
                  r["route"] if r["mode"] == "mirror" else r["trace"], r["candidate"],
                  r["status"], r["verdict"] or "—", r["created_at"][:16],
                  (r["summary"] or r["stop_reason"])[:90]] for r in runs])
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    body = _client(args).get(f"{RUNS}{args.run_id}/export/", {"format": args.format})
    if args.output is None:
        sys.stdout.write(body)
        return 0
    try:
        Path(args.output).write_text(body, encoding="utf-8")
    except OSError as exc:
        raise CliError(f"Cannot write {args.output}: {exc.strerror}", 2) from exc
    print(f"wrote {args.output} ({len(body.encode()):,} bytes)", file=sys.stderr)
    return 0


def _run_or_plan(parser: argparse.ArgumentParser) -> None:
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("run_id", nargs="?", type=_run_id, metavar="RUN", help="a run id")
    which.add_argument("--plan", help="the plan's latest run (stop: its running one)")


def add_commands(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    parser = sub.add_parser("shadow", help="shadow a plan's candidate on live or replayed "
                                           "traffic")
    actions = parser.add_subparsers(dest="shadow_command", metavar="ACTION", required=True)

    start = actions.add_parser(
        "start", help="start a shadow run for a plan (scope jobs)",
        description="Mirror a share of a route's live traffic (or replay a stored trace) to "
                    "the primary, the primary again and the candidate.")
    start.add_argument("--plan", required=True)
    start.add_argument("--mode", choices=MODES, default="mirror",
                       help="mirror (default) or replay (HAProxy-only or quiet routes)")
    start.add_argument("--route", help="a route of the plan (default: its only route)")
    start.add_argument("--trace", help="replay: a stored trace with prompt texts")
    start.add_argument("--percent", type=_percent, default=10.0,
                       help="share of requests sampled, %% (default 10)")
    start.add_argument("--max-rps", type=_rate, default=2.0,
                       help="sampled requests per second at most (default 2)")
    start.add_argument("--max-tokens-per-day", type=_positive_int,
                       help="tokens per UTC day, all three sides (default 2,000,000)")
    start.add_argument("--content", choices=CONTENT, default="redacted",
                       help="what text is stored (default redacted; off: none at all)")
    start.add_argument("--retention-hours", type=_positive_int,
                       help="stored text is purged after this (default 168)")
    start.add_argument("--min-pairs", type=_positive_int,
                       help="pairs before a verdict other than insufficient (default 200)")
    common(start)
    start.set_defaults(func=cmd_start)

    status = actions.add_parser("status", help="a run's counters, per-metric table and "
                                               "verdict")
    _run_or_plan(status)
    common(status)
    status.set_defaults(func=cmd_status)

    stop = actions.add_parser("stop", help="stop a run now: the kill switch (scope jobs)")
    _run_or_plan(stop)
    stop.add_argument("--reason", required=True, help="why (audited, shown on the run)")
    common(stop)
    stop.set_defaults(func=cmd_stop)

    listing = actions.add_parser("list", help="runs, newest first")
    listing.add_argument("--plan")
    listing.add_argument("--status", choices=STATUSES)
    listing.add_argument("--mode", choices=MODES)
    listing.add_argument("--candidate", help="candidate pool name")
    listing.add_argument("--limit", type=row_limit, default=50, help="rows (default 50)")
    common(listing)
    listing.set_defaults(func=cmd_list)

    export = actions.add_parser("export", help="every pair's metrics as CSV or JSON (no text)")
    export.add_argument("run_id", type=_run_id, metavar="RUN")
    export.add_argument("--format", choices=FORMATS, default="csv", help="default csv")
    export.add_argument("-o", "--output", help="file to write (default: standard output)")
    export.set_defaults(func=cmd_export)


__all__ = ["CliError", "add_commands"]
