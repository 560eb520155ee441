"""Writes for migration plans: open a plan, edit its gates, attest, approve, move stages.

Every refusal — no role, one's own plan, a failing gate, a stale approval, a closed plan —
is answered with the reason and recorded as a `denied` audit event on the plan, outside the
refused work's transaction so the record stays while nothing else changes.

`plans` (plans and their gate checks) and `stages` (attestations, approvals, stage moves,
rehearsals) hold what a person does; `worker` what the evidence jobs and beat tasks do;
`_shared` what both use. Import them from here: `from migrations_plan import services`."""

from __future__ import annotations

from migrations_plan.services._shared import (
    EVIDENCE_HOOKS,
    PREDICTION_FIELDS,
    STAGE_MOVE_HOOKS,
)
from migrations_plan.services.plans import (
    CHECK_FIELDS,
    EDITABLE_FIELDS,
    PLAN_FIELDS,
    PREDICTION_HOOKS,
    check_add,
    check_remove,
    check_update,
    plan_create,
    plan_update,
)
from migrations_plan.services.stages import (
    MIN_JUSTIFICATION,
    PAST,
    abandon,
    advance,
    approve,
    attest,
    evidence_report,
    pause,
    regress,
    rehearsal_start,
    resume,
)
from migrations_plan.services.worker import (
    evidence_record,
    passed_gate_risks,
    plan_refresh,
    rehearsal_finish,
)

__all__ = [
    "CHECK_FIELDS",
    "EDITABLE_FIELDS",
    "EVIDENCE_HOOKS",
    "MIN_JUSTIFICATION",
    "PAST",
    "PLAN_FIELDS",
    "PREDICTION_FIELDS",
    "PREDICTION_HOOKS",
    "STAGE_MOVE_HOOKS",
    "abandon",
    "advance",
    "approve",
    "attest",
    "check_add",
    "check_remove",
    "check_update",
    "evidence_record",
    "evidence_report",
    "passed_gate_risks",
    "pause",
    "plan_create",
    "plan_refresh",
    "plan_update",
    "regress",
    "rehearsal_finish",
    "rehearsal_start",
    "resume",
]
