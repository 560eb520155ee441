"""Stage 3's cost arbitrage: what running the candidate costs per 1M output tokens, measured on
a soak's batch work, against what the plan predicted when it entered stage 3.

Measured cost per 1M output tokens = the pool's hourly rate ÷ (the soak's output tokens per
second × 3600) × 1e6, the benchmark's formula, where tokens per second are the soak's output
tokens over the seconds its jobs were running (busy time, not the gaps between jobs: the pool
is paid for by the hour whatever else it does, and batch work fills it). A drill job waits out
a lapsed lease on purpose, so it is left out when the soak has other completed jobs.

The plan chooses the unit (Plan.cost_unit). Per 1M output tokens (the default): as above.
Per successful task: measured = the soak's spend (the hourly rate × the same busy time) ÷ the
custom_ids that succeeded in its jobs, so failed custom_ids and retried attempts are paid for
and count for nothing; predicted = the plan's predicted cost per 1M × the output tokens the
*primary* spends on a task ÷ 1e6: what a task would cost at the predicted price if nothing
failed or was retried and the candidate answered at the primary's length. The primary's
length comes from the soak jobs' comparisons with the primary (batch/compare.py: each
compared pair's tokens, a/b): the candidate's mean output tokens per succeeded custom_id ×
Σ primary tokens ÷ Σ candidate tokens. So the gap is what failures, retries *and* wordier
answers cost: a candidate cheaper per token that says twice as much per task fails per task
while it passes per 1M. With no compared pair (a sample of 0, the primary down) the
candidate's own length stands in, said so, and the two units give one verdict. Per-task
amounts keep 8 decimals (a task costs fractions of a cent).

Two currencies are never one number: the measured cost is converted into the prediction's
currency through the newest dated fleet rate (either direction) by the fleet's one conversion
(fleet/selectors.py `convert`), and the conversion is said ("1 EUR = 1.08 USD, rate of
2026-11-30"). No rate, or only one older than MAX_RATE_AGE_DAYS, no verdict: insufficient,
with what to add.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from decimal import ROUND_HALF_UP, Decimal
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from fleetctl.fleet.costs import TASK_PLACES, cost_per_1m
from fleetctl.fleet.interruption import effective_rate
from fleetctl.fleet.models import money
from fleetctl.fleet.selectors import NoRate, convert, rate_on

if TYPE_CHECKING:
    from fleetctl.batch.models import BatchJob, Soak
    from migrations_plan.models import Plan

PASS, FAIL, INSUFFICIENT = "pass", "fail", "insufficient"
PLACES = Decimal("0.0001")
PER_1M, PER_TASK = "per_1m_output_tokens", "per_successful_task"  # Plan.cost_unit
UNIT_TEXT = {PER_1M: "per 1M output tokens", PER_TASK: "per successful task"}
# The oldest exchange rate a conversion may use, in days before it: the benchmark cost
# check's default (bench/evidence.py, max_rate_age_days), through the same conversion.
MAX_RATE_AGE_DAYS = 31.0


@dataclass
class Arbitrage:
    """The check's answer and every figure behind it, for the evidence row and the plan's
    stage-3 panel. Amounts are Decimals in the currency named beside them."""

    status: str  # pass | fail | insufficient
    message: str
    unit: str = PER_1M  # the plan's cost unit: what predicted, measured and limit are in
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
    # An interruptible pool's tax, in `hourly_rate` (fleet/interruption.py); "" otherwise.
    interruption: str = ""
    interruption_data: dict[str, Any] = field(default_factory=dict)
    # Per 1M output tokens whatever the unit (equal to predicted and measured per 1M).
    predicted_per_1m: Decimal | None = None
    measured_per_1m: Decimal | None = None
    # The soak's measured jobs' custom_ids and what they cost (per successful task).
    succeeded: int = 0
    failed: int = 0
    retries: int = 0
    spend: Decimal | None = None  # hourly rate × busy seconds, in measured_currency
    output_tokens_per_success: float | None = None
    # Per successful task: Σ primary ÷ Σ candidate output tokens over the compared pairs of the
    # soak's jobs (None: no pair; the candidate's own length stands in), and how many pairs.
    primary_length_ratio: float | None = None
    compared_pairs: int = 0

    @property
    def unit_text(self) -> str:
        return UNIT_TEXT[self.unit]

    @property
    def places(self) -> Decimal:
        return PLACES if self.unit == PER_1M else Decimal(1).scaleb(-TASK_PLACES)

    @property
    def verdict(self) -> str:
        """The evidence verdict: pass, fail, or info when there is nothing to judge."""
        return {PASS: "pass", FAIL: "fail"}.get(self.status, "info")

    def as_json(self) -> dict[str, Any]:
        def text(value: Decimal | None) -> str | None:
            return None if value is None else str(value)

        return {
            "status": self.status, "message": self.message, "soak": self.soak_id,
            "unit": self.unit, "predicted": text(self.predicted),
            "measured": text(self.measured),
            "predicted_cost_per_1m": text(self.predicted_per_1m),
            "predicted_currency": self.predicted_currency,
            "predicted_source": self.predicted_source,
            "predicted_at": self.predicted_at.isoformat() if self.predicted_at else None,
            "measured_cost_per_1m": text(self.measured_per_1m),
            "measured_currency": self.measured_currency,
            "measured_in_predicted_currency": text(self.measured_compared),
            "conversion": self.conversion, "conversion_rate": self.conversion_data or None,
            "margin_pct": self.margin_pct, "limit": text(self.limit),
            "output_tokens_per_s": (round(self.output_tokens_per_s, 3)
                                    if self.output_tokens_per_s is not None else None),
            "hourly_rate": text(self.hourly_rate), "busy_seconds": round(self.busy_seconds, 3),
            "output_tokens": self.output_tokens, "jobs": self.jobs,
            "drill_jobs_left_out": self.left_out,
            "interruption": self.interruption_data or None,
            "succeeded": self.succeeded, "failed": self.failed, "retries": self.retries,
            "spend": text(self.spend),
            "output_tokens_per_success": (round(self.output_tokens_per_success, 3)
                                          if self.output_tokens_per_success is not None
                                          else None),
            "primary_length_ratio": (None if self.primary_length_ratio is None
                                     else round(self.primary_length_ratio, 6)),
            "compared_pairs": self.compared_pairs,
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


def _chunk_sums(jobs: list[BatchJob]) -> dict[str, int]:
    """The jobs' output tokens, custom_ids succeeded and failed, and retries: one query."""
    from django.db.models import Sum

    from fleetctl.batch.models import BatchChunk

    sums = BatchChunk.objects.filter(job__in=jobs).aggregate(
        output_tokens=Sum("output_tokens"), succeeded=Sum("succeeded"), failed=Sum("failed"),
        retries=Sum("retries"))
    return {key: int(value or 0) for key, value in sums.items()}


def plan_arbitrage(plan: Plan, soak: Soak | None = None) -> Arbitrage:
    """The plan's cost arbitrage, measured on `soak` (default: its newest soak with a
    completed job). Pass iff measured ≤ predicted × (1 + cost_margin_pct / 100), compared in
    the prediction's currency and in the plan's cost unit."""
    margin = float(plan.cost_margin_pct)
    predicted = (Decimal(str(plan.predicted_cost_per_1m))
                 if plan.predicted_cost_per_1m is not None else None)
    unit = plan.cost_unit if plan.cost_unit in UNIT_TEXT else PER_1M
    answer = Arbitrage(status=INSUFFICIENT, message="", margin_pct=margin, unit=unit,
                       predicted=predicted if unit == PER_1M else None,
                       predicted_per_1m=predicted,
                       predicted_currency=plan.predicted_cost_currency,
                       predicted_source=plan.predicted_cost_source,
                       predicted_at=plan.predicted_cost_at)
    soak = soak or _latest_soak(plan)
    pool = soak.pool if soak is not None else plan.candidate_pool
    tax = effective_rate(pool)  # the pool's rate with its interruption tax, if any
    answer.hourly_rate = hourly_rate = tax.effective_rate or tax.hourly_rate
    answer.measured_currency = pool.currency
    answer.interruption = tax.text
    answer.interruption_data = tax.as_json() if tax.interruptible else {}
    if soak is not None:
        _measure(answer, soak, hourly_rate)
    missing = _missing_figure(answer, plan, soak, pool.name)
    if not missing and tax.not_measured:
        answer.measured = answer.output_tokens_per_s = None
        missing = f"The measured cost of soak {soak.pk if soak else '-'} is {tax.not_measured}."
    if missing:
        answer.message = missing
        return answer
    assert soak is not None and answer.measured is not None and answer.predicted is not None
    converted = _compare_in_predicted_currency(answer)
    if converted is None:
        return answer
    _judge(answer, soak, converted)
    return answer


def _measure(answer: Arbitrage, soak: Soak, hourly_rate: Decimal) -> None:
    """The soak's jobs, busy time, output tokens, custom_ids and (when it has them) measured
    cost in the plan's unit; per successful task, the prediction in that unit too."""
    from fleetctl.fleet.costs import cost_per_success, spend

    answer.soak_id = soak.pk
    jobs, answer.left_out = _measured_jobs(soak)
    answer.jobs = [job.pk for job in jobs]
    answer.busy_seconds = sum((job.finished_at - job.started_at).total_seconds()
                              for job in jobs if job.finished_at and job.started_at)
    sums = _chunk_sums(jobs) if jobs else {"output_tokens": 0, "succeeded": 0, "failed": 0,
                                            "retries": 0}
    answer.output_tokens = sums["output_tokens"]
    answer.succeeded, answer.failed, answer.retries = (sums["succeeded"], sums["failed"],
                                                       sums["retries"])
    if answer.busy_seconds > 0 and answer.output_tokens > 0:
        answer.output_tokens_per_s = answer.output_tokens / answer.busy_seconds
        answer.measured_per_1m = cost_per_1m(hourly_rate, answer.output_tokens_per_s)
    if answer.unit == PER_1M:
        answer.measured = answer.measured_per_1m
        return
    answer.spend = spend(hourly_rate, answer.busy_seconds, places=TASK_PLACES)
    if answer.succeeded <= 0 or answer.busy_seconds <= 0:
        return
    answer.measured = cost_per_success(answer.spend, answer.succeeded, places=TASK_PLACES)
    answer.output_tokens_per_success = answer.output_tokens / answer.succeeded
    answer.primary_length_ratio, answer.compared_pairs = _primary_length_ratio(answer.jobs)
    if answer.predicted_per_1m is not None and answer.output_tokens > 0:
        tokens_a_task = Decimal(answer.output_tokens) / Decimal(answer.succeeded)
        if answer.primary_length_ratio is not None:
            tokens_a_task *= Decimal(str(answer.primary_length_ratio))
        answer.predicted = (answer.predicted_per_1m * tokens_a_task
                            / Decimal(1_000_000)).quantize(answer.places,
                                                           rounding=ROUND_HALF_UP)


def _primary_length_ratio(job_ids: list[int]) -> tuple[float | None, int]:
    """Σ primary ÷ Σ candidate output tokens over the jobs' pairs compared with the primary
    where both answered (batch/compare.py), and how many pairs; (None, 0) with none."""
    from fleetctl.batch.models import BatchComparison

    primary = candidate = pairs = 0
    rows = BatchComparison.objects.filter(job_id__in=job_ids, primary_status=200)
    for outcome in rows.values_list("outcome", flat=True).iterator():
        outcome = outcome or {}
        if outcome.get("errored_a") or outcome.get("errored_b"):
            continue
        a, b = outcome.get("tokens_a"), outcome.get("tokens_b")
        if isinstance(a, int) and isinstance(b, int) and a > 0 and b > 0:
            primary, candidate, pairs = primary + a, candidate + b, pairs + 1
    return (primary / candidate if pairs else None), pairs


def _missing_figure(answer: Arbitrage, plan: Plan, soak: Soak | None, pool_name: str) -> str:
    """Why there is nothing to judge yet (no prediction, no soak, nothing measured), or ""."""
    if answer.predicted_per_1m is None:
        return (f"Plan {plan.name} has no predicted cost per 1M output tokens: it is "
                f"recorded when the plan enters stage 3 from the candidate's "
                f"benchmark cost, or a platform lead sets it (predicted_cost_per_1m "
                f"and predicted_cost_currency on the plan).")
    predicted_text = (f"{money(answer.predicted_per_1m)} {answer.predicted_currency} per 1M "
                      f"output tokens")
    unit = "" if answer.unit == PER_1M else ", judged per successful task"
    if soak is None:
        return (f"Predicted {predicted_text}{unit}; no soak has run on {pool_name} yet to "
                f"measure it (start one in stage 3).")
    if answer.unit == PER_1M and answer.measured is None:
        return (f"Predicted {predicted_text}; soak {soak.pk} has no completed job with "
                f"output tokens yet to measure it.")
    if answer.measured is None:
        return (f"Predicted {predicted_text}{unit}; soak {soak.pk} has no completed job with "
                f"a custom_id that succeeded yet to measure it ({answer.failed} failed).")
    if answer.predicted is None:
        return (f"Predicted {predicted_text}{unit}; soak {soak.pk}'s {answer.succeeded} "
                f"succeeded custom_ids reported no output tokens, so the prediction has no "
                f"per-task figure (measured {_measured_text(answer)} per successful task).")
    return ""


def _predicted_text(answer: Arbitrage) -> str:
    assert answer.predicted is not None
    return f"{money(answer.predicted)} {answer.predicted_currency}"


def _measured_text(answer: Arbitrage) -> str:
    assert answer.measured is not None
    return f"{money(answer.measured)} {answer.measured_currency}"


def _compare_in_predicted_currency(answer: Arbitrage) -> str | None:
    """Set `measured_compared` (the measured cost in the prediction's currency) and return
    how it was converted (" = 7.716 EUR (1 USD = …)", "" for one currency); None, with the
    message set, when there is no usable rate: none, or one older than MAX_RATE_AGE_DAYS,
    which the fleet's conversion refuses as it does for the benchmark's cost check."""
    assert answer.measured is not None
    if answer.measured_currency == answer.predicted_currency:
        answer.measured_compared = answer.measured
        return ""
    on = timezone.localdate()
    try:
        conversion = convert(amount=answer.measured, from_currency=answer.measured_currency,
                             to_currency=answer.predicted_currency, on=on,
                             max_age_days=MAX_RATE_AGE_DAYS)
    except NoRate as exc:
        answer.message = _no_rate_message(answer, on, exc)
        return None
    row = conversion.row
    shown = money(conversion.rate.quantize(Decimal("0.000001")))
    answer.conversion = (f"1 {answer.measured_currency} = {shown} "
                         f"{answer.predicted_currency}, rate of {row.as_of:%Y-%m-%d}"
                         + (f" (the inverse of {row.label})" if conversion.inverted else ""))
    answer.conversion_data = conversion.as_json()
    compared = conversion.amount.quantize(answer.places, rounding=ROUND_HALF_UP)
    answer.measured_compared = compared
    return f" = {money(compared)} {answer.predicted_currency} ({answer.conversion})"


def _no_rate_message(answer: Arbitrage, on: date, refused: NoRate) -> str:
    head = (f"Measured {_measured_text(answer)} {answer.unit_text}, predicted "
            f"{_predicted_text(answer)}: two currencies are compared only through a stated "
            f"rate, and ")
    pair = f"{answer.measured_currency}/{answer.predicted_currency}"
    if rate_on(from_currency=answer.measured_currency, to_currency=answer.predicted_currency,
               on=on) is None:
        return (head + f"there is no {pair} rate. Add one (Fleet → Currency rates, or "
                       f"POST /api/v1/currency-rates/) to judge it.")
    return head + f"{refused} (Fleet → Currency rates, or POST /api/v1/currency-rates/)."


def _task_length_text(answer: Arbitrage) -> str:
    own = answer.output_tokens_per_success or 0
    if answer.primary_length_ratio is None:
        return (f"{own:,.1f} output tokens per succeeded task (no answer compared with the "
                f"primary: the candidate's own length stands in, so per task judges as per "
                f"1M does)")
    return (f"{own * answer.primary_length_ratio:,.1f} output tokens per task at the "
            f"primary's length (the candidate's {own:,.1f} × {answer.primary_length_ratio:.3f}, "
            f"primary ÷ candidate tokens over {answer.compared_pairs:,} compared pairs)")


def _judge(answer: Arbitrage, soak: Soak, converted: str) -> None:
    """Pass or fail against the prediction plus the plan's margin, saying every figure."""
    assert answer.predicted is not None and answer.measured_compared is not None
    margin = answer.margin_pct
    limit = (answer.predicted * (1 + Decimal(str(margin)) / 100)).quantize(
        answer.places, rounding=ROUND_HALF_UP)
    answer.limit = limit
    if answer.unit == PER_1M:
        how = (f"{money(answer.hourly_rate)} {answer.measured_currency}/h"
               + (f" {answer.interruption}" if answer.interruption else "") + " ÷ "
               f"{answer.output_tokens_per_s:,.1f} output tok/s over "
               f"{answer.busy_seconds:,.0f} s of soak {soak.pk}'s jobs")
    else:
        how = (f"{money(answer.spend)} {answer.measured_currency} spent "
               f"({money(answer.hourly_rate)}/h × {answer.busy_seconds:,.0f} s of soak "
               f"{soak.pk}'s jobs"
               + (f", {answer.interruption}" if answer.interruption else "") + ") ÷ "
               f"{answer.succeeded:,} custom_ids that succeeded "
               f"({answer.failed:,} failed, {answer.retries:,} retries); predicted "
               f"{money(answer.predicted_per_1m)} {answer.predicted_currency} per 1M × "
               + _task_length_text(answer))
    margin_text = f" + {margin:g} %" if margin else ""
    measured_text, predicted_text = _measured_text(answer), _predicted_text(answer)
    if answer.measured_compared <= limit:
        answer.status = PASS
        answer.message = (f"Measured {measured_text}{converted} {answer.unit_text}, within "
                          f"the predicted {predicted_text}{margin_text} (limit "
                          f"{money(limit)} {answer.predicted_currency}; {how}).")
    else:
        answer.status = FAIL
        answer.message = (f"Measured {measured_text}{converted} {answer.unit_text}, over the "
                          f"predicted {predicted_text}{margin_text} (limit {money(limit)} "
                          f"{answer.predicted_currency}; {how}).")
