"""`fleetctl conformance run | show | list`: probe a pool against the OpenAI contract (every
endpoint of it, side by side with a reference pool) and read the verdict;
`fleetctl conformance routing-probe ROUTE`: probe a route's routing policy through its
gateways. It talks to the REST API only; the run itself happens on the server's workers."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from fleetctl.cli.client import ApiClient, CliError
from fleetctl.cli.output import (
    checked_number,
    print_fields,
    print_json,
    print_table,
    row_limit,
)

STATUSES = ("queued", "running", "complete", "failed", "cancelled")
VERDICTS = ("pass", "warn", "fail")
ACTIVE = ("queued", "running")
EXIT = {"pass": 0, "warn": 0, "fail": 3}


def _client(args: argparse.Namespace) -> ApiClient:
    return ApiClient.from_env(args.url, args.token)


def _cell(case: dict[str, Any] | None) -> str:
    if case is None:
        return "—"
    if case["status"] == "pass":
        return "pass"
    return f"{case['status']}: {case['got'][:70]}"


def print_cases(run: dict[str, Any]) -> None:
    """One line per case: the pool's endpoints and the reference side by side."""
    pool_rows = [c for c in run["cases"] if c["role"] == "pool"]
    endpoints = list(dict.fromkeys(c["endpoint"] for c in pool_rows))
    keys = list(dict.fromkeys(c["key"] for c in run["cases"]))
    many = len(endpoints) > 1
    headers = ["case", "req"] + [f"{run['pool']}{f' {e}' if many else ''}" for e in endpoints]
    if run["primary"]:
        headers.append(f"{run['primary']} (reference)")
    rows = []
    for key in keys:
        mine = {c["endpoint"]: c for c in pool_rows if c["key"] == key}
        theirs = next((c for c in run["cases"] if c["key"] == key and c["role"] == "primary"),
                      None)
        sample = next(iter(mine.values()), theirs)
        line = [key, "yes" if sample and sample["required"] else "no"]
        line += [_cell(mine.get(e)) for e in endpoints]
        if run["primary"]:
            line.append(_cell(theirs))
        rows.append(line)
    print_table(headers, rows)


def _summary_fields(run: dict[str, Any]) -> list[tuple[str, Any]]:
    return [("run", run["id"]), ("pool", run["pool"]), ("reference", run["primary"]),
            ("plan", run["plan"]), ("model", run["model"]), ("status", run["status"]),
            ("verdict", run["verdict"]), ("summary", run["summary"]), ("error", run["error"]),
            ("evidence", run["evidence_id"])]


def follow(client: ApiClient, run: dict[str, Any], quiet: bool,
           sleep: Callable[[float], None] = time.sleep) -> dict[str, Any]:
    seen = -1
    while run["status"] in ACTIVE:
        sleep(1.0)
        run = client.get(f"/api/v1/conformance-runs/{run['id']}/")
        done = len(run["cases"])
        if not quiet and done != seen:
            print(f"run {run['id']}: {run['status']}, {done} case results", file=sys.stderr)
            seen = done
    return run


def _report(run: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print_json(run)
    else:
        print_fields(_summary_fields(run))
        if run["cases"]:
            print()
            print_cases(run)
    if run["status"] != "complete":
        return 1
    return EXIT.get(run["verdict"], 1)


def cmd_run(args: argparse.Namespace) -> int:
    body: dict[str, Any] = {"pool": args.pool, "plan": args.plan, "primary": args.primary,
                            "model": args.model or "",
                            "include_saturation": args.include_saturation,
                            "required": args.require or []}
    client = _client(args)
    run = client.post("/api/v1/conformance-runs/", body)
    if not args.json:
        print(f"started conformance run {run['id']}: {client.base_url}{run['url']}",
              file=sys.stderr)
    if not args.wait:
        if args.json:
            print_json(run)
        return 0
    return _report(follow(client, run, args.json), args.json)


def cmd_show(args: argparse.Namespace) -> int:
    run = _client(args).get(f"/api/v1/conformance-runs/{args.run_id}/")
    if args.json:
        print_json(run)
        return 0
    print_fields(_summary_fields(run))
    print()
    if run["cases"]:
        print_cases(run)
    else:
        print("(no case judged yet)")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    params = {"pool": args.pool, "plan": args.plan, "status": args.status,
              "verdict": args.verdict}
    runs = _client(args).get_all("/api/v1/conformance-runs/", params, limit=args.limit)
    if args.json:
        print_json(runs)
        return 0
    print_table(["id", "pool", "reference", "plan", "status", "verdict", "created", "summary"],
                [[r["id"], r["pool"], r["primary"] or "—", r["plan"] or "—", r["status"],
                  r["verdict"] or "—", r["created_at"][:16], (r["summary"] or r["error"])[:90]]
                 for r in runs])
    return 0


def cmd_routing_probe(args: argparse.Namespace) -> int:
    """Probe a route's routing policy through its gateways; --wait follows it."""
    client = _client(args)
    probe = client.post("/api/v1/routing-probes/", {"route": args.route, "plan": args.plan,
                                                     "gateway": args.gateway})
    if not args.json:
        print(f"started routing probe {probe['id']}: {client.base_url}{probe['url']}",
              file=sys.stderr)
    while args.wait and probe["status"] in ACTIVE:
        time.sleep(1.0)
        probe = client.get(f"/api/v1/routing-probes/{probe['id']}/")
    if args.json:
        print_json(probe)
    else:
        print_fields([("probe", probe["id"]), ("route", probe["route"]),
                      ("plan", probe["plan"]), ("status", probe["status"]),
                      ("verdict", probe["verdict"]), ("summary", probe["summary"]),
                      ("error", probe["error"]), ("evidence", probe["evidence_id"])])
        if probe["results"]:
            print()
            print_table(["request", "gateway", "allowed", "status", "pool", "result"],
                        [[r["label"], r["gateway"],
                          f"the gateway's {r['refusal']}" if r["refusal"]
                          else ", ".join(r["allowed"]) or "no pool",
                          r["status"] if r["status"] is not None else "—", r["pool"] or "—",
                          f"{r['result']}: {r['detail']}"[:90]] for r in probe["results"]])
    if not args.wait:
        return 0
    if probe["status"] != "complete":
        return 1
    return EXIT.get(probe["verdict"], 1)


_run_id = checked_number(int, lambda number: number >= 1,
                         not_a_number="{value!r} is not a run id (a whole number)",
                         refused="run ids start at 1")


def add_commands(sub: Any, common: Callable[[argparse.ArgumentParser], None]) -> None:
    parser = sub.add_parser("conformance", help="probe a pool against the OpenAI contract")
    actions = parser.add_subparsers(dest="conformance_command", metavar="ACTION",
                                    required=True)
    run = actions.add_parser(
        "run", help="start a probe of a pool (every endpoint); --wait follows it",
        description="Exit status with --wait: 0 pass or warn, 3 fail, 1 the run did not "
                    "finish.")
    run.add_argument("--pool", required=True, help="the pool to probe")
    run.add_argument("--plan", help="a plan whose candidate is the pool (its primary is the "
                                    "reference)")
    run.add_argument("--primary", help="the reference pool, without a plan")
    run.add_argument("--model", help="default: the plan's routes' model or the pool's only one")
    run.add_argument("--include-saturation", action="store_true",
                     help="also flood the pool until it answers 429 (errors.rate_limit)")
    run.add_argument("--require", action="append", metavar="CASE",
                     help="require this case too (repeatable; see the Conformance page)")
    run.add_argument("--wait", action="store_true", help="follow the run to its verdict")
    common(run)
    run.set_defaults(func=cmd_run)
    show = actions.add_parser("show", help="one run: its verdict and cases side by side")
    show.add_argument("run_id", type=_run_id)
    common(show)
    show.set_defaults(func=cmd_show)
    listing = actions.add_parser("list", help="runs, newest first")
    listing.add_argument("--pool")
    listing.add_argument("--plan")
    listing.add_argument("--status", choices=STATUSES)
    listing.add_argument("--verdict", choices=VERDICTS)
    listing.add_argument("--limit", type=row_limit, default=50, help="rows (default 50)")
    common(listing)
    listing.set_defaults(func=cmd_list)
    probe = actions.add_parser(
        "routing-probe", help="probe a route's routing policy through its gateways",
        description="One request at each end of every context tier, one of unknown size, "
                    "the route's jurisdiction on a pinned route; each judged by the pool "
                    "that answered. Exit status with --wait: 0 pass or warn, 3 fail, 1 the "
                    "probe did not finish.")
    probe.add_argument("route", help="the route to probe")
    probe.add_argument("--plan", help="a plan the route belongs to (records evidence)")
    probe.add_argument("--gateway", help="only this gateway (default: every one carrying "
                                         "the route that has a listen_url)")
    probe.add_argument("--wait", action="store_true", help="follow the probe to its verdict")
    common(probe)
    probe.set_defaults(func=cmd_routing_probe)


__all__ = ["CliError", "add_commands"]
