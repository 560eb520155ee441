"""Stage 3's cost arbitrage: what running the candidate costs per 1M output tokens, measured on
a soak's batch work, against what the plan predicted when it entered stage 3.

Measured cost per 1M output tokens = the pool's hourly rate ÷ (the soak's output tokens per
second × 3600) × 1e6, the benchmark's formula, where tokens per second are the soak's output
tokens over the seconds its jobs were running (busy time, not the gaps between jobs: the pool
is paid for by the hour whatever else it does, and batch work fills it). A drill job waits out
a lapsed lease on purpose, so it is left out when the soak has other completed jobs.

Two currencies are never one number: the measured cost is converted into the prediction's
currency through the newest dated fleet rate (either direction), and the conversion is said
("1 EUR = 1.08 USD, rate of 2026-11-30"). No rate, no verdict: insufficient, with what to add.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from fleetctl.fleet.costs import cost_per_1m
from fleetctl.fleet.models import money
from fleetctl.fleet.selectors import rate_on

if TYPE_CHECKING:
    from fleetctl.batch.models import BatchJob, Soak
    from migrations_plan.models import Plan

PASS, FAIL, INSUFFICIENT = "pass", "fail", "insufficient"
PLACES = Decimal("0.0001")


@dataclass
class Arbitrage:
    """The check's answer and every figure behind it, for the evidence row and the plan's
    stage-3 panel. Amounts are Decimals in the currency named beside them."""

    status: str  # pass | fail | insufficient
    message: str
    predicted: Decimal | None = None
    predicted_currency: str = ""
    predicted_source: str = ""
    predicted_at: Any = None
    measured: Decimal | None = None  # in measured_currency (the pool's)
    measured_currency: str = ""
    # The measured cost in the prediction's currency, when the two differ (else = measured).
    measured_compared: Decimal | None = None
    conversion: str = ""  # "1 EUR = 1.08 USD, rate of 2026-11-30"; empty: same currency
    conversion_data: dict[str, Any] = field(default_factory=dict)
    margin_pct: float = 0.0
    limit: Decimal | None = None  # predicted × (1 + margin), in the prediction's currency
    output_tokens_per_s: float | None = None
    hourly_rate: Decimal | None = None
    busy_seconds: float = 0.0
    output_tokens: int = 0
    jobs: list[int] = field(default_factory=list)
    left_out: list[int] = field(default_factory=list)  # drill jobs not measured
    soak_id: int | None = None

    @property
    def verdict(self) -> str:
        """The evidence verdict: pass, fail, or info when there is nothing to judge."""
        return {PASS: "pass", FAIL: "fail"}.get(self.status, "info")

    def as_json(self) -> dict[str, Any]:
        def text(value: Decimal | None) -> str | None:
            return None if value is None else str(value)

        return {
            "status": self.status, "message": self.message, "soak": self.soak_id,
            "predicted_cost_per_1m": text(self.predicted),
            "predicted_currency": self.predicted_currency,
            "predicted_source": self.predicted_source,
            "predicted_at": self.predicted_at.isoformat() if self.predicted_at else None,
            "measured_cost_per_1m": text(self.measured),
            "measured_currency": self.measured_currency,
            "measured_in_predicted_currency": text(self.measured_compared),
            "conversion": self.conversion, "conversion_rate": self.conversion_data or None,
            "margin_pct": self.margin_pct, "limit": text(self.limit),
            "output_tokens_per_s": (round(self.output_tokens_per_s, 3)
                                    if self.output_tokens_per_s is not None else None),
            "hourly_rate": text(self.hourly_rate), "busy_seconds": round(self.busy_seconds, 3),
            "output_tokens": self.output_tokens, "jobs": self.jobs,
            "drill_jobs_left_out": self.left_out,
        }


def _latest_soak(plan: Plan) -> Soak | None:
    """The plan's newest soak that has a completed job (a running one counts: its figures so
    far), else its newest soak."""
    rows = plan.soaks.order_by("-started_at", "-id")
    return rows.filter(jobs__state="completed").distinct().first() or rows.first()


def _measured_jobs(soak: Soak) -> tuple[list[BatchJob], list[int]]:
    done = [job for job in soak.jobs.filter(state="completed").order_by("created_at", "id")
            if job.started_at and job.finished_at]
    plain = [job for job in done if not job.drill]
    if plain and len(plain) < len(done):
        return plain, [job.pk for job in done if job.drill]
    return done, []


def _job_output_tokens(job: BatchJob) -> int:
    from django.db.models import Sum

    total = job.chunks.aggregate(n=Sum("output_tokens"))["n"]
    return int(total or 0)


def plan_arbitrage(plan: Plan, soak: Soak | None = None) -> Arbitrage:
    """The plan's cost arbitrage, measured on `soak` (default: its newest soak with a
    completed job). Pass iff measured ≤ predicted × (1 + cost_margin_pct / 100), compared in
    the prediction's currency."""
    margin = float(plan.cost_margin_pct)
    predicted = plan.predicted_cost_per_1m
    answer = Arbitrage(status=INSUFFICIENT, message="", margin_pct=margin,
                       predicted=Decimal(str(predicted)) if predicted is not None else None,
                       predicted_currency=plan.predicted_cost_currency,
                       predicted_source=plan.predicted_cost_source,
                       predicted_at=plan.predicted_cost_at)
    soak = soak or _latest_soak(plan)
    pool = soak.pool if soak is not None else plan.candidate_pool
    answer.hourly_rate = Decimal(str(pool.node_hourly_rate))
    answer.measured_currency = pool.currency
    if soak is not None:
        answer.soak_id = soak.pk
        jobs, answer.left_out = _measured_jobs(soak)
        answer.jobs = [job.pk for job in jobs]
        answer.busy_seconds = sum((job.finished_at - job.started_at).total_seconds()
                                  for job in jobs if job.finished_at and job.started_at)
        answer.output_tokens = sum(_job_output_tokens(job) for job in jobs)
        if answer.busy_seconds > 0 and answer.output_tokens > 0:
            answer.output_tokens_per_s = answer.output_tokens / answer.busy_seconds
            answer.measured = cost_per_1m(answer.hourly_rate, answer.output_tokens_per_s)

    if answer.predicted is None:
        answer.message = (f"Plan {plan.name} has no predicted cost per 1M output tokens: it is "
                          f"recorded when the plan enters stage 3 from the candidate's "
                          f"benchmark cost, or a platform lead sets it (predicted_cost_per_1m "
                          f"and predicted_cost_currency on the plan).")
        return answer
    predicted_text = f"{money(answer.predicted)} {answer.predicted_currency}"
    if soak is None:
        answer.message = (f"Predicted {predicted_text} per 1M output tokens; no soak has run "
                          f"on {pool.name} yet to measure it (start one in stage 3).")
        return answer
    if answer.measured is None:
        answer.message = (f"Predicted {predicted_text} per 1M output tokens; soak {soak.pk} has "
                          f"no completed job with output tokens yet to measure it.")
        return answer

    measured_text = f"{money(answer.measured)} {answer.measured_currency}"
    compared = answer.measured
    converted = ""
    if answer.measured_currency != answer.predicted_currency:
        found = rate_on(from_currency=answer.measured_currency,
                        to_currency=answer.predicted_currency, on=timezone.localdate())
        if found is None:
            answer.message = (
                f"Measured {measured_text} per 1M output tokens, predicted {predicted_text}: "
                f"two currencies are compared only through a stated rate, and there is no "
                f"{answer.measured_currency}/{answer.predicted_currency} rate. Add one "
                f"(Fleet → Currency rates, or POST /api/v1/currency-rates/) to judge it.")
            return answer
        row, inverted = found
        rate = (Decimal(1) / row.rate) if inverted else row.rate
        shown = money(rate.quantize(Decimal("0.000001")))
        answer.conversion = (f"1 {answer.measured_currency} = {shown} "
                             f"{answer.predicted_currency}, rate of {row.as_of:%Y-%m-%d}"
                             + (f" (the inverse of {row.label})" if inverted else ""))
        answer.conversion_data = {"from": answer.measured_currency,
                                  "to": answer.predicted_currency, "rate": str(rate),
                                  "as_of": row.as_of.isoformat(), "rate_id": row.pk,
                                  "source": row.source, "inverted": inverted}
        compared = (answer.measured * rate).quantize(PLACES, rounding=ROUND_HALF_UP)
        converted = f" = {money(compared)} {answer.predicted_currency} ({answer.conversion})"
    answer.measured_compared = compared
    limit = (answer.predicted * (1 + Decimal(str(margin)) / 100)).quantize(
        PLACES, rounding=ROUND_HALF_UP)
    answer.limit = limit
    how = (f"{money(answer.hourly_rate)} {answer.measured_currency}/h ÷ "
           f"{answer.output_tokens_per_s:,.1f} output tok/s over "
           f"{answer.busy_seconds:,.0f} s of soak {soak.pk}'s jobs")
    margin_text = f" + {margin:g} %" if margin else ""
    if compared <= limit:
        answer.status = PASS
        answer.message = (f"Measured {measured_text}{converted} per 1M output tokens, within "
                          f"the predicted {predicted_text}{margin_text} (limit "
                          f"{money(limit)} {answer.predicted_currency}; {how}).")
    else:
        answer.status = FAIL
        answer.message = (f"Measured {measured_text}{converted} per 1M output tokens, over the "
                          f"predicted {predicted_text}{margin_text} (limit {money(limit)} "
                          f"{answer.predicted_currency}; {how}).")
    return answer
