"""The `ramp-slo` evidence kind, registered with its producer: every hold of a ramp of a
plan's candidate that the guard judged (pass, warn or fail) records one row about the
candidate, with the numbers it used. Stage 4's check "Per-pool percentiles hold at each ramp
step" reads the newest one; "Per-pool percentiles held for N days" (`watch.held`,
watch_rule.py) reads the standing watch that follows a completed ramp."""

from __future__ import annotations

from typing import Any

from migrations_plan.evidence import ANY_OBJECT, EvidenceKind, data_schema, register_kind

KIND = "ramp-slo"
PRODUCED_BY = ("guarded ramps (the route page's \"Start a ramp\", fleetctl ramp start, "
               "POST /api/v1/ramps/): one row per judged hold")

DATA_SCHEMA: dict[str, Any] = data_schema({
    "ramp": {"type": "integer"},
    "route": {"type": "string"},
    "step": {"type": "integer", "minimum": 0},
    "percent": {"type": "number"},
    "steps_total": {"type": "integer"},
    "decision": {"enum": ["pass", "warn", "fail"]},
    "window_s": {"type": "number"},
    "held_s": {"type": "number", "minimum": 0},
    "candidate": ANY_OBJECT,
    "primary": ANY_OBJECT,
    "thresholds": ANY_OBJECT,
    "reasons": {"type": "array", "items": {"type": "string"}},
})


def register() -> None:
    register_kind(EvidenceKind(KIND, "per-pool SLO during the ramp", PRODUCED_BY,
                               data_schema=DATA_SCHEMA))
    # Stage 4's "Per-pool percentiles held for N days": the standing watch's history.
    from fleetctl.ramps.watch_rule import register as register_watch_rule

    register_watch_rule()
