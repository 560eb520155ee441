"""`fleetctl`: the command line for on-call engineers and scripts. It talks to the REST API
(FLEETCTL_URL, FLEETCTL_TOKEN), so it can do exactly what the token may do, no more."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import datetime
from typing import Any

from fleetctl import __version__
from fleetctl.cli import (
    batch,
    bench,
    conformance,
    evals,
    plans,
    ramps,
    shadow,
    telemetry,
    tokens,
    traffic,
)
from fleetctl.cli.client import ApiClient, CliError
from fleetctl.cli.output import print_fields, print_json, print_table, row_limit

HEALTH = ("healthy", "unhealthy", "unknown")
RUNTIMES = ("cuda", "rocm", "tpu", "gaudi", "other")


def _client(args: argparse.Namespace) -> ApiClient:
    return ApiClient.from_env(args.url, args.token)


def _models(pool: dict[str, Any]) -> str:
    return ", ".join(f"{m['model_id']} ({m['quantisation']})" for m in pool["models"]) or "—"


def _cost(pool: dict[str, Any]) -> str:
    cost = pool.get("cost_per_1m_output_tokens")
    return f"{cost} {pool['currency']}" if cost is not None else "—"


def cmd_pools_list(args: argparse.Namespace) -> int:
    params = {"runtime": args.runtime, "region": args.region, "health_state": args.health,
              "jurisdiction": args.jurisdiction, "model": args.model}
    pools = _client(args).get_all("/api/v1/pools/", params)
    if args.json:
        print_json(pools)
        return 0
    print_table(
        ["name", "runtime", "accelerator", "region", "health", "latency ms", "models",
         "cost/1M out"],
        [[p["name"], p["runtime"], p["accelerator"], f"{p['region']} ({p['jurisdiction']})",
          p["health_state"],
          f"{p['last_probe_latency_ms']:.1f}" if p["last_probe_latency_ms"] else "—",
          _models(p), _cost(p)] for p in pools],
    )
    return 0


def cmd_pools_show(args: argparse.Namespace) -> int:
    client = _client(args)
    pool = client.get(f"/api/v1/pools/{args.name}/")
    if args.json:
        print_json(pool)
        return 0
    print_fields([
        ("name", pool["name"]), ("runtime", f"{pool['runtime']} {pool['runtime_version']}"),
        ("accelerator", pool["accelerator"]),
        ("region", f"{pool['region']} (jurisdiction {pool['jurisdiction']})"),
        ("endpoints", ", ".join(pool["base_urls"])), ("latency class", pool["latency_class"]),
        ("max context", pool["max_context_tokens"]),
        ("node hourly rate", f"{pool['node_hourly_rate']} {pool['currency']}"),
        ("cost per 1M output", _cost(pool)),
        ("health", f"{pool['health_state']} since {pool['health_changed_at'] or '—'}"),
        ("last probe", f"{pool['last_probe_at'] or '—'} "
                       f"{pool['last_probe_error'] or ''}".strip()),
        ("labels", ", ".join(f"{k}={v}" for k, v in sorted(pool["labels"].items()))),
    ])
    print()
    print_table(["model", "revision", "quantisation", "max context"],
                [[m["model_id"], m["revision"], m["quantisation"], m["max_context_tokens"]]
                 for m in pool["models"]])
    return 0


def _iso(value: str) -> str:
    try:
        datetime.fromisoformat(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO date/time, e.g. 2026-11-30 or 2026-11-30T08:00:00Z"
        ) from exc
    return value


def cmd_audit(args: argparse.Namespace) -> int:
    params = {"action": args.action, "actor": args.actor, "since": args.since,
              "until": args.until, "object_type": args.object_type, "outcome": args.outcome}
    events = _client(args).get_all("/api/v1/audit-events/", params, limit=args.limit)
    if args.json:
        print_json(events)
        return 0
    print_table(["at", "actor", "action", "outcome", "object"],
                [[e["at"], e["actor"], e["action"], e["outcome"], e["object_repr"]]
                 for e in events])
    return 0


def cmd_whoami(args: argparse.Namespace) -> int:
    me = _client(args).get("/api/v1/me/")
    if args.json:
        print_json(me)
        return 0
    print_fields([("user", me["username"]), ("roles", ", ".join(me["roles"])),
                  ("permissions", ", ".join(me["permissions"])),
                  ("token", (me["token"] or {}).get("prefix"))])
    return 0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="machine-readable output")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetctl", description="Control plane for staged LLM-serving migrations.",
        epilog="Environment: FLEETCTL_URL (default http://127.0.0.1:8000), FLEETCTL_TOKEN.",
    )
    parser.add_argument("--version", action="version", version=f"fleetctl {__version__}")
    parser.add_argument("--url", help="server URL (overrides FLEETCTL_URL)")
    parser.add_argument("--token", help="API token (overrides FLEETCTL_TOKEN)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    pools = sub.add_parser("pools", help="list and inspect serving pools")
    pools_sub = pools.add_subparsers(dest="pools_command", metavar="ACTION", required=True)
    listing = pools_sub.add_parser("list", help="list pools (filters combine)")
    listing.add_argument("--runtime", choices=RUNTIMES)
    listing.add_argument("--region", help="region code")
    listing.add_argument("--jurisdiction", help="e.g. EU, US, IN")
    listing.add_argument("--health", choices=HEALTH)
    listing.add_argument("--model", help="only pools serving this model id")
    _common(listing)
    listing.set_defaults(func=cmd_pools_list)
    show = pools_sub.add_parser("show", help="one pool in detail")
    show.add_argument("name")
    _common(show)
    show.set_defaults(func=cmd_pools_show)

    audit = sub.add_parser("audit", help="read the audit log (newest first)")
    audit.add_argument("--action", help="action prefix, e.g. pool. or token.create")
    audit.add_argument("--actor", help="exact actor, e.g. alice or service:ci-bot")
    audit.add_argument("--object-type", help="e.g. fleet.pool")
    audit.add_argument("--outcome", choices=("ok", "denied", "failed"))
    audit.add_argument("--since", type=_iso, help="ISO date/time")
    audit.add_argument("--until", type=_iso, help="ISO date/time")
    audit.add_argument("--limit", type=row_limit, default=50, help="rows (default 50)")
    _common(audit)
    audit.set_defaults(func=cmd_audit)

    whoami = sub.add_parser("whoami", help="who this token acts as, and what it may do")
    _common(whoami)
    whoami.set_defaults(func=cmd_whoami)

    traffic.add_commands(sub, _common)
    ramps.add_commands(sub, _common)
    telemetry.add_commands(sub, _common)
    plans.add_commands(sub, _common)
    bench.add_commands(sub, _common)
    conformance.add_commands(sub, _common)
    shadow.add_commands(sub, _common)
    evals.add_commands(sub, _common)
    batch.add_commands(sub, _common)
    tokens.add_commands(sub, _common)
    _mount_optional(sub, "sim", "fleetctl.sim.cli", "run simulated accelerator pools")
    return parser


def _mount_optional(sub: Any, name: str, module: str, help_text: str) -> None:
    """Mount a subcommand that lives in its own package (e.g. the simulator)."""
    import importlib

    try:
        mod = importlib.import_module(module)
    except ImportError:
        return
    parser = sub.add_parser(name, help=help_text)
    mod.add_arguments(parser)
    run: Callable[[argparse.Namespace], int] = mod.run
    parser.set_defaults(func=run)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args))
    except CliError as exc:
        print(f"fleetctl: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
