"""The stage-3 evidence kinds, registered with their producers (fleetctl/batch/):

- `checkpoint-resume`: a job run with an interruption drill records one row when it ends,
  verified from the result rows (every custom_id exactly one result) with the resume time.
- `soak`: a soak records one row when its duration is over (or it fails early): its jobs'
  throughput, error rate, retries and any manual intervention.
- `cost-arbitrage`: recorded beside each soak row: the measured cost per 1M output tokens
  (the soak's batch throughput and the pool's hourly rate) against the plan's prediction.
"""

from __future__ import annotations

from typing import Any

from migrations_plan.evidence import EvidenceKind, register_kind

DRILL_KIND = "checkpoint-resume"
SOAK_KIND = "soak"
COST_KIND = "cost-arbitrage"

DRILL_PRODUCED_BY = ("batch jobs run with an interruption drill (the job form's \"Drill\", "
                     "fleetctl batch submit --drill, POST /api/v1/batch/jobs/)")
SOAK_PRODUCED_BY = ("batch soaks on a plan's candidate (the plan page's \"Start a soak\", "
                    "fleetctl batch soak start, POST /api/v1/batch/soaks/)")
COST_PRODUCED_BY = ("batch soaks: the soak's measured throughput and the pool's hourly rate, "
                    "against the prediction the plan recorded when it entered stage 3")

_OBJECT = {"type": "object", "additionalProperties": True}
_ANY_OBJECT_SCHEMA: dict[str, Any] = {"type": "object", "additionalProperties": True}

_COUNT = {"type": "integer", "minimum": 0}
_WHEN = {"type": ["string", "null"]}
# What fleetctl/batch/drill.py records (drill_verify's data); more fields may be added.
DRILL_DATA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "additionalProperties": True,
    "required": ["job", "drill", "state", "total", "results", "missing", "resends",
                 "duplicates_refused", "resume_s", "reasons"],
    "properties": {
        "job": {"type": "integer"},
        "drill": {"enum": ["kill-worker", "fault-pool"]},
        "state": {"type": "string"},
        "total": _COUNT, "results": _COUNT, "missing": _COUNT, "mismatched": _COUNT,
        "repeated": _COUNT, "resends": _COUNT, "duplicates_refused": _COUNT,
        "missing_sample": {"type": "array", "items": {"type": "string"}},
        "fired_at": _WHEN, "resumed_at": _WHEN, "fault_cleared_at": _WHEN,
        "resume_s": {"type": ["number", "null"]},
        "killed_worker": {"type": "string"}, "resumed_by": {"type": "string"},
        "in_flight_at_drill": {"type": ["integer", "null"]},
        "reasons": {"type": "array", "items": {"type": "string"}},
    },
}


def register() -> None:
    register_kind(EvidenceKind(DRILL_KIND, "checkpoint and resume", DRILL_PRODUCED_BY,
                               data_schema=DRILL_DATA_SCHEMA))
    register_kind(EvidenceKind(SOAK_KIND, "batch soak", SOAK_PRODUCED_BY,
                               data_schema=_ANY_OBJECT_SCHEMA))
    register_kind(EvidenceKind(COST_KIND, "measured cost arbitrage", COST_PRODUCED_BY,
                               data_schema=_ANY_OBJECT_SCHEMA))
