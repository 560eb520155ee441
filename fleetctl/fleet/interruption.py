"""The interruption tax of an interruptible pool: what its reclaims and the standby kept for
them add to each hour of it, so every cost figure of the pool includes them.

    reclaim cost per hour = reclaims a month ÷ 730 h × (re-warm s + lost work s) ÷ 3600 × rate
    standby per hour      = rate × standby % ÷ 100
    effective rate        = rate + both

Re-warm and lost work are the pool's own, measured: its newest passed interruption drill of
the last HORIZON_DAYS (fleet asks the layers that run drills through DRILL_SOURCES; batch
answers with its `checkpoint-resume` evidence: re-warm = the drill's resume_s, from the
interruption to the first result written after it; lost work = the requests in flight at it,
sent again, × the drill job's mean measured request latency). The reclaim model and the
standby are the pool's fields (`reclaims_per_month`, `standby_pct`).

Both parts are proportional to the rate, so the tax is an uplift: a cost per 1M computed at
the bare rate × (1 + uplift) is the cost at the effective rate (`InterruptionTax.apply`).
Figures apply it when they are read, so a changed reclaim model or a newer drill holds at
once everywhere. An interruptible pool without a measured drill has no tax, and no cost:
"not measured: run an interruption drill on <pool>", never a zero tax.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

from django.utils import timezone

if TYPE_CHECKING:
    from fleetctl.fleet.models import Pool

HORIZON_DAYS = 90
HOURS_A_MONTH = Decimal(730)
_PLACES = Decimal("0.0001")


@dataclass(frozen=True)
class DrillMeasure:
    """What one passed interruption drill measured on a pool."""

    evidence_id: int
    observed_at: datetime
    source: str  # "batch job 7"
    url: str
    rewarm_s: float  # from the interruption to serving again
    redone: int  # requests in flight at the interruption, sent again
    mean_request_s: float | None  # the drill job's mean measured request latency

    @property
    def lost_s(self) -> float | None:
        """Work redone per reclaim, in request-seconds (redone × mean request time)."""
        if not self.redone:
            return 0.0
        return None if self.mean_request_s is None else self.redone * self.mean_request_s

    def as_json(self) -> dict[str, Any]:
        return {"evidence": self.evidence_id, "observed_at": self.observed_at.isoformat(),
                "source": self.source, "url": self.url, "rewarm_s": round(self.rewarm_s, 3),
                "redone": self.redone,
                "mean_request_s": (None if self.mean_request_s is None
                                   else round(self.mean_request_s, 3)),
                "lost_s": None if self.lost_s is None else round(self.lost_s, 3)}


# Called with (pools, since, until): each pool's newest passed drill observed in that span,
# by pool id. The layer that runs drills registers here (batch, in its ready()).
DrillSource = Callable[[list["Pool"], datetime, datetime], dict[int, DrillMeasure]]
DRILL_SOURCES: list[DrillSource] = []


def register_drill_source(source: DrillSource) -> DrillSource:
    if source not in DRILL_SOURCES:
        DRILL_SOURCES.append(source)
    return source


@dataclass
class InterruptionTax:
    """A pool's hourly rate and its interruption tax, itemised. Amounts per hour, in the
    pool's currency; `factor` = effective ÷ bare rate (1 for a pool that is not
    interruptible)."""

    pool: str
    interruptible: bool
    hourly_rate: Decimal
    currency: str
    reclaims_per_month: Decimal | None = None
    standby_pct: Decimal | None = None
    drill: DrillMeasure | None = None
    reclaim_per_h: Decimal | None = None
    standby_per_h: Decimal | None = None
    tax_per_h: Decimal | None = None
    effective_rate: Decimal | None = None
    factor: Decimal | None = None
    not_measured: str = ""  # why there is no tax (so no cost); "" when there is one

    @property
    def uplift_pct(self) -> Decimal | None:
        return None if self.factor is None else (self.factor - 1) * 100

    @property
    def text(self) -> str:
        """What a cost figure says of it: "incl. interruption tax +6.2 % (…)", the reason it
        is not measured, or "" for a pool that is not interruptible."""
        if not self.interruptible:
            return ""
        if self.not_measured:
            return self.not_measured
        drill = self.drill
        assert drill is not None and self.uplift_pct is not None
        return (f"incl. interruption tax +{self.uplift_pct:.1f} % (reclaims "
                f"{_num(self.reclaims_per_month)}/month, re-warm {drill.rewarm_s:.1f} s, lost "
                f"work {drill.lost_s or 0:.1f} s, standby {_num(self.standby_pct)} %; measured "
                f"by the drill of {drill.source})")

    def apply(self, cost: Decimal | str | float | None) -> Decimal | None:
        """A cost computed at the bare rate, at the effective rate (None when the tax is not
        measured, or there is no cost)."""
        if cost is None or self.factor is None:
            return None
        if not self.interruptible:
            return Decimal(str(cost))
        return (Decimal(str(cost)) * self.factor).quantize(_PLACES, rounding=ROUND_HALF_UP)

    def as_json(self) -> dict[str, Any]:
        def text(value: Decimal | None) -> str | None:
            return None if value is None else str(value.quantize(_PLACES))

        return {
            "pool": self.pool, "interruptible": self.interruptible, "currency": self.currency,
            "hourly_rate": text(self.hourly_rate),
            "reclaims_per_month": text(self.reclaims_per_month),
            "standby_pct": text(self.standby_pct),
            "drill": self.drill.as_json() if self.drill else None,
            "reclaim_per_h": text(self.reclaim_per_h), "standby_per_h": text(self.standby_per_h),
            "tax_per_h": text(self.tax_per_h), "effective_rate": text(self.effective_rate),
            "uplift_pct": (None if self.uplift_pct is None
                           else str(self.uplift_pct.quantize(Decimal("0.01")))),
            "not_measured": self.not_measured or None, "text": self.text or None,
        }


def _num(value: Decimal | None) -> str:
    """4.00 -> 4, 2.50 -> 2.5."""
    return format(Decimal(value or 0).normalize(), "f")


def _tax(pool: Pool, drill: DrillMeasure | None) -> InterruptionTax:
    rate = Decimal(str(pool.node_hourly_rate or 0))
    tax = InterruptionTax(pool=pool.name, interruptible=pool.interruptible, hourly_rate=rate,
                          currency=pool.currency)
    if not pool.interruptible:
        tax.factor, tax.effective_rate, tax.tax_per_h = Decimal(1), rate, Decimal(0)
        return tax
    tax.reclaims_per_month = Decimal(str(pool.reclaims_per_month or 0))
    tax.standby_pct = Decimal(str(pool.standby_pct or 0))
    tax.drill = drill
    if drill is None:
        tax.not_measured = (f"not measured: {pool.name} is interruptible and no interruption "
                            f"drill passed on it in the last {HORIZON_DAYS} days to price a "
                            f"reclaim; run a drill on {pool.name} (a batch job with a drill)")
        return tax
    if drill.lost_s is None:
        tax.not_measured = (f"not measured: the drill of {drill.source} on {pool.name} resent "
                            f"{drill.redone} request(s) but measured no request latency to "
                            f"price them; run a drill on {pool.name} again")
        return tax
    seconds = Decimal(str(drill.rewarm_s)) + Decimal(str(drill.lost_s))
    reclaim_share = tax.reclaims_per_month / HOURS_A_MONTH * seconds / Decimal(3600)
    standby_share = tax.standby_pct / Decimal(100)
    tax.factor = 1 + reclaim_share + standby_share
    tax.reclaim_per_h = rate * reclaim_share
    tax.standby_per_h = rate * standby_share
    tax.tax_per_h = tax.reclaim_per_h + tax.standby_per_h
    tax.effective_rate = (rate + tax.tax_per_h).quantize(Decimal("0.000001"))
    return tax


def effective_rates(pools: Iterable[Pool], *, on: datetime | None = None
                    ) -> dict[str, InterruptionTax]:
    """Each pool's rate and tax as of `on` (default now), by name; the drills of all the
    interruptible ones in one read per drill source (none when no pool is interruptible)."""
    on = on or timezone.now()
    rows = list(pools)
    exposed = [pool for pool in rows if pool.interruptible]
    drills: dict[int, DrillMeasure] = {}
    if exposed:
        since = on - timedelta(days=HORIZON_DAYS)
        for source in DRILL_SOURCES:
            for pool_id, drill in source(exposed, since, on).items():
                held = drills.get(pool_id)
                if held is None or drill.observed_at > held.observed_at:
                    drills[pool_id] = drill
    return {pool.name: _tax(pool, drills.get(pool.pk)) for pool in rows}


def effective_rate(pool: Pool, *, on: datetime | None = None) -> InterruptionTax:
    """The pool's hourly rate plus its interruption tax, itemised, as of `on` (default now)."""
    return effective_rates([pool], on=on)[pool.name]
