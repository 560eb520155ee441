"""A plan's business case (docs/cost.md, "The business case"): does the measured arbitrage
pay for the second backend's ops burden?

- The arbitrage per 1M output tokens is the primary's cost minus the candidate's, both from
  their latest comparable benchmark evidence, read through the gate's own comparison
  (`bench.evidence.cost_vs_primary`: like with like, the candidate's currency converted to
  the primary's through a dated rate); annualised at the plan's expected volume (× 12).
- The burden is the engineer-weeks of the seven rows × the cost of an engineer-year ÷
  WORKING_WEEKS, converted into the primary's currency through the rate dated on or before
  the day judged (`fleet.selectors.convert`, the one conversion function).
- The verdict: "pays for itself" when the arbitrage covers the burden; else "justified only
  by capacity or residency" when the plan records such a reason or the capacity forecast
  shows the primary short at peak; else "does not pay". Whatever is missing (a benchmark, a
  comparable pair, a rate, the volume) makes it "not measured" with the reason — never 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from django.utils import timezone

from fleetctl.bench.evidence import cost_vs_primary
from fleetctl.economics.forecast import Forecast, plan_forecast
from fleetctl.economics.models import BURDEN_ROWS, BusinessCase
from fleetctl.fleet.models import money
from fleetctl.fleet.selectors import NoRate, convert
from migrations_plan.evidence import FAIL, PASS, RuleContext
from migrations_plan.models import Plan

# An engineer-year is this many working weeks (52 less holidays and leave).
WORKING_WEEKS = Decimal("46")
# The same limits as the gate's cost check (benchmark.cost_vs_primary's defaults).
EVIDENCE_DAYS = 30.0
MAX_RATE_AGE_DAYS = 31.0

PAYS, DOES_NOT, JUSTIFIED, NOT_MEASURED = ("pays", "does-not-pay", "justified",
                                           "not-measured")
VERDICT_WORDS = {PAYS: "pays for itself", DOES_NOT: "does not pay for itself",
                 JUSTIFIED: "justified only by capacity or residency",
                 NOT_MEASURED: "not measured"}


def _q(value: Decimal, places: str = "0.01") -> Decimal:
    return value.quantize(Decimal(places), rounding=ROUND_HALF_UP)


@dataclass
class Case:
    verdict: str
    headline: str  # one sentence: the verdict with its numbers
    currency: str  # every amount below is in it (the primary's)
    reasons: list[str] = field(default_factory=list)  # why not measured / what overrides
    changes: list[str] = field(default_factory=list)  # what would change the verdict
    numbers: dict[str, Any] = field(default_factory=dict)
    burden_rows: list[dict[str, Any]] = field(default_factory=list)
    forecast: Forecast | None = None

    @property
    def verdict_words(self) -> str:
        return VERDICT_WORDS[self.verdict]

    def as_json(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "verdict_words": self.verdict_words,
                "headline": self.headline, "currency": self.currency,
                "reasons": self.reasons, "what_would_change_it": self.changes,
                "numbers": self.numbers, "burden": self.burden_rows,
                "capacity_forecast": self.forecast.as_json() if self.forecast else None}


def _arbitrage_per_1m(plan: Plan, now: Any) -> tuple[Decimal | None, dict[str, Any], str]:
    """(primary − candidate per 1M in the primary's currency, the comparison's numbers, why
    none)."""
    ctx = RuleContext(plan=plan, candidate=plan.candidate_pool, primary=plan.primary_pool,
                      routes=list(plan.routes.order_by("name")), now=now)
    result = cost_vs_primary(ctx, {"within_days": EVIDENCE_DAYS,
                                   "max_rate_age_days": MAX_RATE_AGE_DAYS})
    numbers = dict(result.numbers or {})
    if "primary_cost_per_1m" not in numbers or result.status not in (PASS, FAIL) or (
            numbers.get("candidate_currency") != numbers.get("primary_currency")
            and "candidate_cost_converted" not in numbers):
        return None, numbers, result.summary
    candidate = Decimal(str(numbers.get("candidate_cost_converted")
                            or numbers["candidate_cost_per_1m"]))
    return Decimal(str(numbers["primary_cost_per_1m"])) - candidate, numbers, result.summary


def _burden(case: BusinessCase, currency: str, on: date
            ) -> tuple[Decimal | None, dict[str, Any], str]:
    weeks = case.burden_weeks.quantize(Decimal("0.1"))
    cost = case.engineer_cost_per_year
    conversion: dict[str, Any] | None = None
    if case.engineer_cost_currency != currency:
        try:
            converted = convert(amount=cost, from_currency=case.engineer_cost_currency,
                                to_currency=currency, on=on, max_age_days=MAX_RATE_AGE_DAYS)
        except NoRate as exc:
            return None, {"burden_weeks": str(weeks)}, (
                f"the engineer cost is in {case.engineer_cost_currency} and the pools' costs "
                f"in {currency}: there is {exc}")
        cost = converted.amount
        conversion = {**converted.as_json(), "text": converted.text}
    burden = weeks * cost / WORKING_WEEKS
    return burden, {"burden_weeks": str(weeks), "engineer_cost_per_year": str(_q(cost)),
                    "engineer_cost_conversion": conversion,
                    "working_weeks": str(WORKING_WEEKS), "burden_per_year": str(_q(burden))}, ""


def _overrides(case: BusinessCase, forecast: Forecast) -> list[str]:
    """What justifies a second vendor whatever the arbitrage: a recorded reason, or the
    primary short of its SLO capacity at the forecast's peak."""
    overrides = []
    if case.override:
        overrides.append(f"the plan records a {case.override} reason: "
                         f"{case.override_reason}")
    if forecast.primary_short:
        primary = next(p for p in forecast.pools if p.role == "primary")
        overrides.append(f"at the peak of the last {forecast.days} days "
                         f"({forecast.peak.streams:.1f} streams) the primary "
                         f"{primary.capacity.pool} is short: its SLO capacity is "
                         f"{primary.capacity.streams:g} streams")
    return overrides


def _what_changes_it(out: Case, *, saving: Decimal, burden: Decimal, volume: Decimal,
                     annual: Decimal, weeks: Decimal, primary_cost: Decimal) -> None:
    """The break-even volume, the burden the arbitrage covers and the candidate cost it needs:
    into out.numbers and out.changes."""
    cur = out.currency
    if saving > 0:
        break_even = burden / (saving * 12)
        out.numbers["break_even_mtokens_per_month"] = str(_q(break_even, "0.001"))
        out.changes.append(f"The arbitrage covers the burden above {_q(break_even, '0.1')} M "
                           f"output tokens a month at today's measured costs.")
        if weeks and burden:
            weeks_covered = annual / (burden / weeks)  # ÷ one week's cost
            out.changes.append(f"At this volume it covers up to {_q(weeks_covered, '0.1')} "
                               f"engineer-weeks a year.")
    else:
        out.numbers["break_even_mtokens_per_month"] = None
        out.changes.append(f"The candidate costs {money(_q(-saving, '0.0001'))} {cur} more per "
                           f"1M output tokens than the primary: no volume makes it pay; a "
                           f"cheaper candidate rate or a faster benchmark would.")
    needed = burden / (volume * 12)
    out.changes.append(f"At this volume the candidate must cost at most "
                       f"{money(_q(primary_cost - needed, '0.0001'))} {cur} per 1M output "
                       f"tokens (primary {money(primary_cost)} {cur}).")


def _unmeasured(out: Case, missing: list[str], overrides: list[str]) -> Case:
    out.reasons = missing + overrides
    if overrides:
        out.verdict = JUSTIFIED
        out.headline = (f"Justified only by capacity or residency ({'; '.join(overrides)})"
                        f"; the economics are not measured.")
    else:
        out.headline = "Not measured: " + "; ".join(missing) + "."
    return out


def judge(plan: Plan, case: BusinessCase, *, now: Any = None) -> Case:
    now = now or timezone.now()
    cur = plan.primary_pool.currency
    rows = [{"field": name, "title": title, "means": means,
             "weeks": str(getattr(case, name)), "default": str(default), "why": why}
            for name, title, means, default, why in BURDEN_ROWS]
    forecast = plan_forecast(plan, days=case.peak_days, now=now)
    out = Case(verdict=NOT_MEASURED, headline="", currency=cur, burden_rows=rows,
               forecast=forecast)
    saving, compared, why_no_saving = _arbitrage_per_1m(plan, now)
    out.numbers["comparison"] = compared
    burden, burden_numbers, why_no_burden = _burden(case, cur, timezone.localdate(now))
    out.numbers.update(burden_numbers)
    volume = case.expected_mtokens_per_month
    out.numbers["expected_mtokens_per_month"] = None if volume is None else str(volume)
    overrides = _overrides(case, forecast)
    missing = []
    if saving is None:
        why = why_no_saving.rstrip(".")
        missing.append(f"the arbitrage: {why[:1].lower()}{why[1:]}")
    if burden is None:
        missing.append(f"the burden: {why_no_burden}")
    if volume is None:
        missing.append("the expected volume: set the output tokens per month the plan "
                       "expects to move")
    if saving is not None:
        out.numbers["arbitrage_per_1m"] = str(_q(saving, "0.0001"))
    if missing:
        return _unmeasured(out, missing, overrides)
    assert saving is not None and burden is not None and volume is not None
    annual = saving * volume * 12
    out.numbers["arbitrage_per_year"] = str(_q(annual))
    net = annual - burden
    out.numbers["net_per_year"] = str(_q(net))
    said = (f"the measured arbitrage is {money(_q(saving, '0.0001'))} {cur} per 1M output "
            f"tokens × {volume.normalize():f} M tokens/month × 12 = {money(_q(annual))} {cur} "
            f"a year, against an ops burden of {case.burden_weeks.normalize():f} "
            f"engineer-weeks = {money(_q(burden))} {cur} a year")
    _what_changes_it(out, saving=saving, burden=burden, volume=volume, annual=annual,
                     weeks=case.burden_weeks,
                     primary_cost=Decimal(str(compared["primary_cost_per_1m"])))
    if annual >= burden:
        out.verdict = PAYS
        out.headline = f"Pays for itself: {said}; {money(_q(net))} {cur} a year to spare."
        out.reasons = overrides
    elif overrides:
        out.verdict = JUSTIFIED
        out.headline = (f"Justified only by capacity or residency: {said}, "
                        f"{money(_q(-net))} {cur} a year short, but {'; '.join(overrides)}.")
        out.reasons = overrides
    else:
        out.verdict = DOES_NOT
        out.headline = (f"Does not pay for itself: {said}, {money(_q(-net))} {cur} a year "
                        f"short. Stay on one vendor unless capacity or residency forces it.")
    return out
