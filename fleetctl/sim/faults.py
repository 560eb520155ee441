"""Faults an operator injects into a simulated pool (POST /admin/faults): errors, added
latency, a slowdown, the whole pool down, or an upgrade nobody registered (the server
version `GET /version` reports, as vLLM's does, or the weights revision each model's card in
`GET /v1/models` reports)."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

from .apierror import ApiError

# What `GET /version` answers until an operator "upgrades" the pool (`server_version`).
SERVER_VERSION = "0.8.5+sim"
_VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
# The weights revision `GET /v1/models` reports for each model (`revision` on the model card)
# until an operator swaps the weights (`model_revision`).
MODEL_REVISION = "sim-weights-1"


@dataclass
class Faults:
    error_rate: float = 0.0
    added_latency_ms: float = 0.0
    slowdown: float = 1.0
    down: bool = False
    server_version: str = SERVER_VERSION
    model_revision: str = MODEL_REVISION

    def validated(self, data: Any) -> Faults:
        """A new Faults with `data` applied, or ApiError(400) naming the bad field."""
        if not isinstance(data, dict):
            raise ApiError(400, "Expected a JSON object of fault settings.")
        current = asdict(self)
        for key, value in data.items():
            if key not in current:
                allowed = ", ".join(sorted(current))
                raise ApiError(400, f"Unknown fault field '{key}' (allowed: {allowed}).",
                               param=key)
            current[key] = _check_fault(key, value)
        return Faults(**current)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _check_fault(key: str, value: Any) -> Any:
    if key == "server_version":
        if not isinstance(value, str) or not _VERSION.fullmatch(value):
            raise ApiError(400, "Invalid 'server_version': expected 1-64 characters of "
                                "letters, digits and . _ + - (e.g. 0.9.0).", param=key)
        return value
    if key == "model_revision":
        if not isinstance(value, str) or not _VERSION.fullmatch(value):
            raise ApiError(400, "Invalid 'model_revision': expected 1-64 characters of "
                                "letters, digits and . _ + - (e.g. 3f1c2ab).", param=key)
        return value
    if key == "down":
        if not isinstance(value, bool):
            raise ApiError(400, "Invalid 'down': expected true or false.", param=key)
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, f"Invalid '{key}': expected a number.", param=key)
    ok, expected = {
        "error_rate": (0.0 <= value <= 1.0, "between 0 and 1"),
        "added_latency_ms": (0.0 <= value <= 600_000, "between 0 and 600000"),
        "slowdown": (1.0 <= value <= 1000.0, "between 1 and 1000"),
    }[key]
    if not ok:
        raise ApiError(400, f"Invalid '{key}': expected a value {expected}, got {value!r}.",
                       param=key)
    return float(value)


def down_error(reason: str = "pool is down") -> ApiError:
    message = "The pool is down (simulated fault)." if reason == "pool is down" else (
        f"The request was aborted: {reason}."
    )
    return ApiError(503, message, type="server_error", code="service_unavailable")
