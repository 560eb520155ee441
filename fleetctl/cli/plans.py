"""`fleetctl plans list | show`: where each migration stands and what its gate still needs.
Read-only on purpose: approving and advancing are done signed in, on the dashboard."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from fleetctl.cli.client import ApiClient
from fleetctl.cli.output import print_fields, print_json, print_table

STATES = ("stage-1", "stage-2", "stage-3", "stage-4", "paused", "abandoned", "completed")
# Statuses are printed in the server's words (status_label): one vocabulary everywhere.
BLOCKED = "blocked"


def _client(args: argparse.Namespace) -> ApiClient:
    return ApiClient.from_env(args.url, args.token)


def _days_since(stamp: str | None) -> str:
    if not stamp:
        return "—"
    then = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    return f"{(datetime.now(UTC) - then).total_seconds() / 86400:.1f} d"


def _gate_brief(gate: dict[str, Any] | None) -> str:
    if not gate:
        return "—"
    blocked = f" ({BLOCKED})" if gate.get("blocks_advance") else ""
    return f"{gate['passed']}/{gate['total']} pass · {gate['status_label']}{blocked}"


def cmd_plans_list(args: argparse.Namespace) -> int:
    params = {"state": args.state, "candidate_pool": args.candidate, "route": args.route}
    plans = _client(args).get_all("/api/v1/plans/", params)
    if args.json:
        print_json(plans)
        return 0
    print_table(["name", "state", "candidate", "primary", "routes", "gate", "in stage", "owner",
                 "target"],
                [[p["name"], p["state"], p["candidate_pool"], p["primary_pool"],
                  ", ".join(p["routes"]), _gate_brief(p["gate"]),
                  _days_since(p["stage_entered_at"]) if p["gate"] else "—", p["owner"],
                  p["target_date"] or "—"] for p in plans])
    return 0


def _approval_line(approval: dict[str, Any]) -> list[Any]:
    counts = "yes" if approval["counts"] else f"no: {approval['why_not']}"
    return [approval["by"], approval["at"], approval["gate_status_label"],
            counts, approval["justification"] or "—"]


def _sources(check: dict[str, Any]) -> str:
    """Where each piece of evidence comes from: measured by, reported by, attested by."""
    seen = dict.fromkeys(ref["source_label"] for ref in check["evidence"])
    return "; ".join(seen) or "—"


def _state(plan: dict[str, Any]) -> str:
    if plan["state"] == "paused":
        return f"paused at stage {plan['stage']} ({plan['stage_name']})"
    return str(plan["state_label"])


def cmd_plans_show(args: argparse.Namespace) -> int:
    plan = _client(args).get(f"/api/v1/plans/{args.name}/")
    if args.json:
        print_json(plan)
        return 0
    gate = plan["gate"]
    counting = sum(1 for a in plan["approvals"] if a["counts"])
    print_fields([
        ("plan", plan["name"]), ("state", _state(plan)),
        ("in stage since", f"{plan['stage_entered_at']} ({_days_since(plan['stage_entered_at'])})"),
        ("candidate", plan["candidate_pool"]), ("primary", plan["primary_pool"]),
        ("routes", ", ".join(plan["routes"])),
        ("SLO", f"TTFT p95 ≤ {plan['slo_ttft_p95_ms']:g} ms, TPOT p95 ≤ "
                f"{plan['slo_tpot_p95_ms']:g} ms, errors ≤ {plan['slo_error_rate']:g}"),
        ("margins", f"latency {plan['latency_margin_pct']:g} %, cost "
                    f"{plan['cost_margin_pct']:g} %, quality {plan['quality_margin_pct']:g} pp"),
        ("owner", plan["owner"]), ("opened by", plan["created_by"]),
        ("target date", plan["target_date"]),
        ("approvals", f"{counting} of {plan['required_approvals']} required"),
    ])
    print()
    blocked = f" ({BLOCKED}: cannot be approved or advanced)" if gate["blocks_advance"] else ""
    print(f"gate to leave stage {gate['stage']} ({gate['stage_name']}): "
          f"{gate['status_label']}{blocked} · {gate['passed']}/{gate['total']} pass")
    print_table(["status", "check", "kind", "summary", "evidence from"],
                [[c["status_label"], c["title"], c["kind"], c["summary"], _sources(c)]
                 for c in gate["checks"]])
    if plan["approvals"]:
        print()
        print_table(["approved by", "at", "gate was", "counts", "justification"],
                    [_approval_line(a) for a in plan["approvals"]])
    return 0


def add_commands(sub: Any, common: Any) -> None:
    plans = sub.add_parser("plans", help="migration plans and their stage gates")
    plans_sub = plans.add_subparsers(dest="plans_command", metavar="ACTION", required=True)
    listing = plans_sub.add_parser("list", help="every plan, its stage and gate progress")
    listing.add_argument("--state", choices=STATES)
    listing.add_argument("--candidate", help="only plans for this candidate pool")
    listing.add_argument("--route", help="only plans joining this route")
    common(listing)
    listing.set_defaults(func=cmd_plans_list)
    show = plans_sub.add_parser("show", help="a plan's gate checklist and approvals")
    show.add_argument("name")
    common(show)
    show.set_defaults(func=cmd_plans_show)


__all__ = ["add_commands"]
