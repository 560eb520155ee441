"""The `shadow` evidence kind, registered with its producer: this app's runs. A running
shadow run's judge (beat) records one Evidence row of this kind about the candidate as pairs
arrive (services.run_judge); the stage-2 check "Divergence vs primary within the noise floor
plus margin" (rule `evidence.latest`) reads the newest still-valid one."""

from __future__ import annotations

from typing import Any

from migrations_plan.evidence import ANY_OBJECT, EvidenceKind, data_schema, register_kind

KIND = "shadow"
PRODUCED_BY = ("shadow runs (the plan page's Shadow panel, fleetctl shadow start, "
               "POST /api/v1/shadow-runs/)")

# What a run's evidence row carries in `data` (rows written before the shadow job existed,
# with no data, still read). `metrics`: each gated metric's interval.
DATA_SCHEMA: dict[str, Any] = data_schema({
    "run": {"type": "integer"},
    "mode": {"enum": ["mirror", "replay"]},
    "pairs": {"type": "integer", "minimum": 0},
    "min_pairs": {"type": "integer", "minimum": 1},
    "margin": {"type": "number"},
    "confidence": {"type": "number"},
    "window": {"type": "object", "additionalProperties": {"type": ["string", "null"]}},
    # When the judgement restarted (a pool changed: only pairs received after count) and why.
    "since": {"type": ["string", "null"]},
    "since_why": {"type": "string"},
    "metrics": {"type": "object", "additionalProperties": ANY_OBJECT},
    "gated": {"type": "array", "items": {"type": "string"}},
    "counters": {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0}},
    "primary": {"type": "string"},
    "candidate": {"type": "string"},
    "fingerprints": {"type": "object", "additionalProperties": {"type": "object"}},
    "route": {"type": ["string", "null"]},
    "model": {"type": "string"},
})


def register() -> None:
    # refreshed: the judge re-records the run's one judgement as pairs arrive; an approval
    # binds to the judgement (same run, verdict, fingerprints), not to the newest row.
    register_kind(EvidenceKind(KIND, "shadow divergence", PRODUCED_BY, data_schema=DATA_SCHEMA,
                               refreshed=True))
