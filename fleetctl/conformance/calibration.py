"""How each pool's tokenizer counts a prompt, measured by the conformance probe, for the
gateway's estimate of a prompt's size (docs/traffic.md, "Prompt size at the gateway").
Registered with traffic (fleetctl/traffic/prompt_size.py) when the app loads: traffic sits
below conformance and reads calibrations through that hook.

The conformance probe's prompt-token parity case sends fixed message sets (PARITY_MESSAGES:
1, 2 and 4 short messages, and a ~1.4 kB passage of prose) and records each pool's
`usage.prompt_tokens`, the reference pool's beside it. The counts of known prompts fit the
three numbers of the estimate by least squares: tokens = base + per_message x messages +
text bytes / chars_per_token (runs recorded before the passage was added have three sets,
which fit exactly but set chars_per_token from ~270 bytes of short sentences). A
pool with no such run, or whose fit is out of range, gets the documented default
(PromptCalibration(): ~4 bytes a token, as for English under common BPE tokenizers, and a
chat template of 5 tokens a message plus 6).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from django.db.models import Q

from fleetctl.conformance.cases.probe import PARITY_MESSAGES
from fleetctl.traffic.gateways.base import PromptCalibration

PARITY_CASE = "parity.prompt_tokens"


def text_bytes(messages: Sequence[dict[str, Any]]) -> int:
    """The bytes of the messages' text as a JSON body carries it (what the gateway counts)."""
    return sum(len(json.dumps(m["content"])) - 2 for m in messages
               if isinstance(m.get("content"), str))


def fit(counts: Sequence[Any]) -> PromptCalibration | None:
    """The calibration that reproduces `counts` (usage.prompt_tokens of PARITY_MESSAGES, in
    order), or None when they are missing or give numbers no tokenizer has."""
    if not 3 <= len(counts) <= len(PARITY_MESSAGES) or not all(
            isinstance(c, int) and not isinstance(c, bool) and c > 0 for c in counts):
        return None
    rows = [(1.0, float(len(ms)), float(text_bytes(ms))) for ms in PARITY_MESSAGES[:len(counts)]]
    # Least squares (the normal equations): exact for three sets; with the passage, its
    # many bytes set chars_per_token and the short sets the template's tokens.
    normal = [tuple(sum(r[i] * r[j] for r in rows) for j in range(3)) for i in range(3)]
    moments = [sum(r[i] * c for r, c in zip(rows, counts, strict=True)) for i in range(3)]
    solved = _solve3(normal, moments)  # type: ignore[arg-type]
    if solved is None:
        return None
    base, per_message, per_byte = solved
    if per_byte <= 0:
        return None
    cal = PromptCalibration(chars_per_token=round(1 / per_byte, 3),
                            per_message=round(per_message, 3), base=round(base, 3),
                            source="conformance")
    if not (0.5 <= cal.chars_per_token <= 32 and 0 <= cal.per_message <= 64
            and 0 <= cal.base <= 256):
        return None
    return cal


def _solve3(rows: list[tuple[float, float, float]], rhs: list[float]
            ) -> tuple[float, float, float] | None:
    """Cramer's rule for three equations."""
    def det(m: list[tuple[float, float, float]]) -> float:
        return (m[0][0] * (m[1][1] * m[2][2] - m[1][2] * m[2][1])
                - m[0][1] * (m[1][0] * m[2][2] - m[1][2] * m[2][0])
                + m[0][2] * (m[1][0] * m[2][1] - m[1][1] * m[2][0]))
    d = det(rows)
    if abs(d) < 1e-9:
        return None
    out = []
    for col in range(3):
        m = [tuple(rhs[r] if c == col else rows[r][c] for c in range(3)) for r in range(3)]
        out.append(det(m) / d)  # type: ignore[arg-type]
    return out[0], out[1], out[2]


def pool_calibrations(names: Iterable[str]) -> dict[str, PromptCalibration]:
    """Pool name -> its calibration from its latest recorded parity counts (as the pool under
    test or as a reference); pools without any are left out (the caller's default applies)."""
    from fleetctl.conformance.models import ConformanceCase

    wanted = set(names)
    if not wanted:
        return {}
    found: dict[str, PromptCalibration] = {}
    cases = (ConformanceCase.objects.filter(key=PARITY_CASE)
             .filter(Q(pool__name__in=wanted) | Q(numbers__reference_pool__in=wanted))
             .exclude(status=ConformanceCase.Status.ERROR)
             .select_related("pool").order_by("-at", "-pk").only("numbers", "pool__name")[:200])
    for case in cases:
        numbers = case.numbers or {}
        for name, counts in ((case.pool.name, numbers.get("pool")),
                             (numbers.get("reference_pool"), numbers.get("reference"))):
            if name in wanted and name not in found and isinstance(counts, list):
                cal = fit(counts)
                if cal is not None:
                    found[name] = cal
        if len(found) == len(wanted):
            break
    return found
