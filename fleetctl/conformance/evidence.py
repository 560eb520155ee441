"""The `conformance` evidence kind, registered with its producer: this app's probe. A
finished run records one Evidence row of this kind about the pool under test (services.py);
the stage-1 check "Passes the OpenAI-contract conformance probe" (rule `evidence.latest`)
reads the newest still-valid one."""

from __future__ import annotations

from typing import Any

from migrations_plan.evidence import EvidenceKind, data_schema, register_kind

KIND = "conformance"
PRODUCED_BY = ("the conformance probe (Conformance → Run, the stage-1 gate's button, "
               "fleetctl conformance run, POST /api/v1/conformance-runs/)")

# What a run's evidence row carries in `data` (a run always writes every field; none is
# required so that rows recorded before the probe existed, with no data, still read).
DATA_SCHEMA: dict[str, Any] = data_schema({
    "run": {"type": "integer"},
    "counts": {"type": "object",
               "additionalProperties": {"type": "integer", "minimum": 0}},
    "failing": {"type": "array", "items": {"type": "string"}},
    "required_failing": {"type": "array", "items": {"type": "string"}},
    "required_skipped": {"type": "array", "items": {"type": "string"}},
    "cases": {"type": "object", "additionalProperties": {
        "enum": ["pass", "fail", "skip", "error"]}},
    "primary": {"type": ["string", "null"]},
    "endpoints": {"type": "array", "items": {"type": "string"}},
    "model": {"type": "string"},
})


def register() -> None:
    register_kind(EvidenceKind(KIND, "OpenAI-contract conformance", PRODUCED_BY,
                               data_schema=DATA_SCHEMA))
