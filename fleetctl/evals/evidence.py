"""The `eval` and `live-quality` evidence kinds, registered with their producers.

A finished eval run records one `eval` Evidence row about the candidate (services.py); the
stage-2 check "Eval suite passes on this backend" reads the newest still-valid one. An eval
run never records `live-quality`, whatever the plan's stage: a fixed suite is not live
traffic. Only a shadow run judged while its plan is in stage 4 (mirrored live requests,
shadow/services/judging.py) records it; the stage-4 check "Quality unchanged on live traffic"
reads that kind. This app registers the kind because the row's data shares the eval schema.
"""

from __future__ import annotations

from typing import Any

from migrations_plan.evidence import ANY_OBJECT, EvidenceKind, data_schema, register_kind

KIND = "eval"
LIVE_KIND = "live-quality"
PRODUCED_BY = ("eval runs (the plan page's \"Run the stage's eval\", fleetctl eval run, "
               "POST /api/v1/eval-runs/)")
LIVE_PRODUCED_BY = ("shadow runs judged while the plan is in stage 4 (a shadow of live "
                    "requests); never an eval run")

# What a run's evidence row carries in `data` (rows written before eval runs existed, with
# no data, still read).
DATA_SCHEMA: dict[str, Any] = data_schema({
    "run": {"type": "integer"},
    "source": {"enum": ["eval", "shadow"]},
    "stage": {"type": ["integer", "null"]},
    "suite": {"type": "string"},
    "suite_version": {"type": "integer"},
    "suite_sha256": {"type": "string"},
    "items": {"type": "integer", "minimum": 0},
    "min_items": {"type": "integer", "minimum": 1},
    "margin": {"type": "number"},
    "confidence": {"type": "number"},
    "candidate": {"type": "string"},
    "primary": {"type": ["string", "null"]},
    "model": {"type": "string"},
    "pools": {"type": "object", "additionalProperties": ANY_OBJECT},
    "paired": ANY_OBJECT,
    "tags": {"type": "object", "additionalProperties": ANY_OBJECT},
    "fingerprints": {"type": "object", "additionalProperties": {"type": "object"}},
    # A shadow run's live-quality row: its gated metrics' intervals.
    "metrics": {"type": "object", "additionalProperties": ANY_OBJECT},
})


def register() -> None:
    register_kind(EvidenceKind(KIND, "eval suite", PRODUCED_BY, data_schema=DATA_SCHEMA))
    # refreshed: a stage-4 shadow run re-records its one judgement as pairs arrive (as the
    # `shadow` kind); an approval binds to the judgement, not to the newest row.
    register_kind(EvidenceKind(LIVE_KIND, "quality on live traffic (stage 4)",
                               LIVE_PRODUCED_BY, data_schema=DATA_SCHEMA, refreshed=True))
