"""`fleetctl routes | split | drain | restore | drains`: the on-call engineer's lever (`ramp`,
guarded ramps and the old `ramp --weights`, is cli/ramps.py)."""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from fleetctl.cli.client import ApiClient, CliError
from fleetctl.cli.output import checked_number, print_fields, print_json, print_table

TERMINAL = ("complete", "failed")


def _client(args: argparse.Namespace) -> ApiClient:
    return ApiClient.from_env(args.url, args.token)


def _split(weights: dict[str, float]) -> str:
    return ", ".join(f"{pool} {pct:g} %" for pool, pct in weights.items()) or "— (no pool)"


def cmd_routes_list(args: argparse.Namespace) -> int:
    routes = _client(args).get_all("/api/v1/routes/")
    if args.json:
        print_json(routes)
        return 0
    print_table(["name", "model", "class", "pin", "primary", "rev", "split"],
                [[r["name"], r["model_id"], r["latency_class"] or "any", r["residency"] or "—",
                  r["primary_pool"], r["revision_number"],
                  _split((r["current"] or {}).get("weights", {}))] for r in routes])
    return 0


def cmd_routes_show(args: argparse.Namespace) -> int:
    client = _client(args)
    route = client.get(f"/api/v1/routes/{args.name}/")
    history = client.get(f"/api/v1/routes/{args.name}/revisions/", {"page_size": 10})
    if args.json:
        print_json(route | {"revisions": history["results"]})
        return 0
    print_fields([("route", route["name"]), ("model", route["model_id"]),
                  ("latency class", route["latency_class"] or "any"),
                  ("residency pin", route["residency"] or "—"),
                  ("primary", route["primary_pool"]), ("gateways", ", ".join(route["gateways"])),
                  ("revision", route["revision_number"])])
    print()
    print_table(["rev", "kind", "split", "by", "at", "reason"],
                [[r["number"], r["kind"], _split(r["weights"]), r["created_by"],
                  r["created_at"], r["reason"]] for r in history["results"]])
    return 0


def _weights(text: str) -> dict[str, str]:
    weights: dict[str, str] = {}
    for part in text.split(","):
        pool, sep, percent = part.partition("=")
        if not sep or not pool.strip() or not percent.strip():
            raise argparse.ArgumentTypeError(
                f"{part!r}: write weights as pool=percent,pool=percent, e.g. "
                "h200-us-east=99.9,mi300x-us-east=0.1")
        weights[pool.strip()] = percent.strip()
    return weights


def cmd_split(args: argparse.Namespace) -> int:
    """Set a route's split at once (`fleetctl split`, and `fleetctl ramp --weights`)."""
    client = _client(args)
    base = args.base_revision
    if base is None:
        base = client.get(f"/api/v1/routes/{args.route}/")["revision_number"]
    wait = _wait_params(args)
    revision = client.post(f"/api/v1/routes/{args.route}/revisions/", {
        "weights": args.weights, "base_revision": base, "reason": args.reason,
        "force": args.force,
    }, wait, idempotent=True, timeout_s=_http_timeout(wait))
    if args.json:
        print_json(revision)
        return 0 if revision.get("verified", True) else 1
    note = " (unchanged: already the split in force)" if revision.get("unchanged") else ""
    print(f"{args.route} r{revision['number']}: {_split(revision['weights'])}{note}")
    if "verified" in revision:
        _print_verified(revision["gateways"], revision["verified"])
        return 0 if revision["verified"] else 1
    return 0


cmd_ramp = cmd_split  # the name `fleetctl ramp --weights` has always called


def _wait_params(args: argparse.Namespace) -> dict[str, Any]:
    if not getattr(args, "wait_verified", False):
        return {}
    return {"wait": "verified", "timeout": f"{args.verify_timeout:g}"}


def _http_timeout(wait: dict[str, Any]) -> float | None:
    """The server holds a ?wait=verified answer up to its timeout: wait a little longer."""
    return float(wait["timeout"]) + 15.0 if wait else None


def _print_verified(gateways: list[dict[str, Any]], verified: bool) -> None:
    print_table(["gateway", "status", "verified at", "attempts", "error"],
                [[g["name"], g["status"], g["verified_at"] or "—", g["attempts"],
                  g["error"]] for g in gateways])
    print("verified on every gateway" if verified else
          "NOT verified on every gateway within the timeout")


def _progress_line(drain: dict[str, Any]) -> str:
    gateways = drain["gateways"]
    done = sum(1 for g in gateways if g["status"] in ("verified", "superseded"))
    ms = drain["verified_ms"]
    verified = f" verified in {ms:.0f} ms" if ms is not None else ""
    return (f"drain {drain['id']}: {drain['status']} · gateways {done}/{len(gateways)}"
            f"{verified}" + (f" · {drain['last_error']}" if drain["last_error"] else ""))


def follow(client: ApiClient, drain: dict[str, Any], timeout_s: float, quiet: bool) -> dict:
    """Poll the record, rewriting one progress line, until complete (or the timeout)."""
    deadline = time.monotonic() + timeout_s
    tty = sys.stderr.isatty()
    while drain["status"] not in TERMINAL and time.monotonic() < deadline:
        if not quiet:
            end = "\r" if tty else "\n"
            print(_progress_line(drain).ljust(78), end=end, file=sys.stderr, flush=True)
        time.sleep(0.2)
        drain = client.get(f"/api/v1/drains/{drain['id']}/")
    if not quiet:
        print(_progress_line(drain).ljust(78), file=sys.stderr)
    return drain


def _report(drain: dict[str, Any], as_json: bool) -> int:
    if as_json:
        print_json(drain)
    else:
        print_table(["gateway", "route", "rev", "status", "applied", "verified", "error"],
                    [[g["gateway"] + (" (deleted)" if g.get("gateway_deleted") else ""),
                      g["route"], g["revision"], g["status"], g["applied_at"],
                      g["verified_at"], g["last_error"]] for g in drain["gateways"]])
        capacity = drain.get("capacity") or {}
        if capacity.get("decision"):
            print(f"capacity: {capacity['decision']}: {capacity['why']}")
        total = f"{drain['duration_ms']:.0f} ms" if drain["duration_ms"] is not None else "—"
        print(f"outcome: {drain['status']}; in-flight zero at "
              f"{drain['in_flight_zero_at'] or '—'}; total {total}")
    return 0 if drain["status"] == "complete" else 1


def cmd_drain(args: argparse.Namespace) -> int:
    client = _client(args)
    body = {"reason": args.reason} | ({"route": args.route} if args.route else
                                      {"pool": args.pool})
    if args.force:
        body["force"] = True
    wait = _wait_params(args)
    drain = client.post("/api/v1/drains/", body, wait, idempotent=True,
                        timeout_s=_http_timeout(wait))
    if "verified" in drain and not args.json:
        print("verified on every gateway" if drain["verified"] else
              "NOT verified on every gateway within the timeout", file=sys.stderr)
    if args.no_wait:
        _report(drain, args.json)
        return 0
    return _report(follow(client, drain, args.timeout, args.json), args.json)


def cmd_restore(args: argparse.Namespace) -> int:
    client = _client(args)
    record = client.post(f"/api/v1/drains/{args.drain_id}/restore/", {"reason": args.reason},
                         idempotent=True)
    return _report(follow(client, record, args.timeout, args.json), args.json)


def cmd_drains(args: argparse.Namespace) -> int:
    drains = _client(args).get_all("/api/v1/drains/", limit=args.limit)
    if args.json:
        print_json(drains)
        return 0
    print_table(["id", "action", "target", "status", "by", "requested", "verified ms",
                 "total ms"],
                [[d["id"], d["action"], d["route"] or d["pool"], d["status"],
                  d["requested_by"], d["requested_at"],
                  f"{d['verified_ms']:.0f}" if d["verified_ms"] is not None else "—",
                  f"{d['duration_ms']:.0f}" if d["duration_ms"] is not None else "—"]
                 for d in drains])
    return 0


_positive_seconds = checked_number(float, lambda seconds: 0 < seconds <= 3600,
                                  not_a_number="{value!r} is not a number of seconds",
                                  refused="choose between 0 and 3600 seconds")


def split_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """The flags of a split change: `fleetctl split`, and the old `fleetctl ramp --weights`
    (where they are optional, since `ramp` has subcommands too)."""
    parser.add_argument("--route", required=required)
    parser.add_argument("--weights", required=required, type=_weights,
                        help="pool=percent,… adding up to 100, e.g. h200=99.9,mi300x=0.1")
    parser.add_argument("--reason", required=required)
    parser.add_argument("--base-revision", type=int,
                        help="the revision you are changing (default: the current one)")
    parser.add_argument("--force", action="store_true", help="allow an unhealthy pool")
    wait_arguments(parser)


def _verify_seconds(value: str) -> float:
    seconds = _positive_seconds(value)
    if seconds > 60:
        raise argparse.ArgumentTypeError("choose between 0 and 60 seconds")
    return seconds


def wait_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--wait-verified", action="store_true",
                        help="answer once every gateway verified the change (exit 1 if not "
                             "within --verify-timeout)")
    parser.add_argument("--verify-timeout", type=_verify_seconds, default=10.0,
                        help="seconds the server waits for the gateways (default 10, max 60)")


def add_commands(sub: Any, common: Any) -> None:
    routes = sub.add_parser("routes", help="routes and their current split")
    routes_sub = routes.add_subparsers(dest="routes_command", metavar="ACTION", required=True)
    listing = routes_sub.add_parser("list", help="every route and its split")
    common(listing)
    listing.set_defaults(func=cmd_routes_list)
    show = routes_sub.add_parser("show", help="a route and its recent revisions")
    show.add_argument("name")
    common(show)
    show.set_defaults(func=cmd_routes_show)

    split = sub.add_parser("split", help="set a route's split at once (token scope `ramp`)")
    split_arguments(split, required=True)
    common(split)
    split.set_defaults(func=cmd_split)

    drain = sub.add_parser("drain", help="move a route or a pool back to the primary, now")
    target = drain.add_mutually_exclusive_group(required=True)
    target.add_argument("--route", help="drain this route to its primary")
    target.add_argument("--pool", help="drain this pool off every route")
    drain.add_argument("--reason", required=True, help="goes in the record")
    drain.add_argument("--force", action="store_true",
                       help="on-call: everything to the primary at once, whatever its "
                            "capacity (default: capacity-checked, spread or stepped)")
    drain.add_argument("--no-wait", action="store_true", help="return once requested")
    drain.add_argument("--timeout", type=_positive_seconds, default=120.0,
                       help="seconds to follow progress (default 120)")
    wait_arguments(drain)
    common(drain)
    drain.set_defaults(func=cmd_drain)

    restore = sub.add_parser("restore", help="undo a drain: back to the split before it")
    restore.add_argument("drain_id", type=int)
    restore.add_argument("--reason", default="")
    restore.add_argument("--timeout", type=_positive_seconds, default=120.0)
    common(restore)
    restore.set_defaults(func=cmd_restore)

    drains = sub.add_parser("drains", help="recent drains and restores, timed")
    drains.add_argument("--limit", type=int, default=20)
    common(drains)
    drains.set_defaults(func=cmd_drains)


__all__ = ["CliError", "add_commands"]
