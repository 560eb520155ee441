"""What a pool's hours cost per 1M output tokens: the one formula the benchmark (a pool's
cost) and the batch soak (the measured cost arbitrage) both use; and what they cost per
successful task (a batch job's custom_ids, an eval run's items, live requests): the spend
(rate × hours) ÷ the tasks that succeeded, failures and retries counted in the spend."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from decimal import ROUND_HALF_UP, Decimal
from typing import Any


def cost_per_1m(hourly_rate: Decimal | str | int | float,
                output_tokens_per_s: Decimal | str | int | float,
                places: int = 4) -> Decimal:
    """Cost per 1M output tokens = hourly rate / tokens per second × 1e6 / 3600, in Decimal
    (floats go through their shortest repr), rounded half-up to `places` decimals."""
    rate = Decimal(str(hourly_rate))
    tps = Decimal(str(output_tokens_per_s))
    if rate < 0:
        raise ValueError("hourly rate must be >= 0")
    if tps <= 0:
        raise ValueError("output tokens per second must be > 0")
    cost = rate * Decimal(1_000_000) / (tps * Decimal(3600))
    return cost.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)


def spend(hourly_rate: Decimal | str | int | float, seconds: float, places: int = 4) -> Decimal:
    """What `seconds` of a pool cost at `hourly_rate`: rate × seconds ÷ 3600, in Decimal,
    rounded half-up to `places` decimals (the pool is paid for by the hour, busy or not)."""
    rate = Decimal(str(hourly_rate))
    if rate < 0:
        raise ValueError("hourly rate must be >= 0")
    if seconds < 0:
        raise ValueError("seconds must be >= 0")
    return (rate * Decimal(str(seconds)) / Decimal(3600)).quantize(
        Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)


# Decimals of a per-task amount: a request or a custom_id costs fractions of a cent.
TASK_PLACES = 8


def cost_per_success(spent: Decimal | str, succeeded: int,
                     places: int = TASK_PLACES) -> Decimal:
    """Cost per successful task = what was spent ÷ the tasks that succeeded: failed attempts
    and retries are in the spend and in none of the successes, so they raise it. Rounded
    half-up to `places` decimals (default 8: fractions of a cent still compare)."""
    if succeeded <= 0:
        raise ValueError("succeeded must be > 0")
    return (Decimal(str(spent)) / Decimal(succeeded)).quantize(
        Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)


@dataclass
class TaskCost:
    """Cost per successful task of one piece of work on one pool (a batch job, an eval run's
    pool): the pool's hourly rate × the seconds it was busy with it, ÷ the tasks that
    succeeded. Never a 0 for what was not measured: `not_measured` says why."""

    pool: str
    unit: str  # what a success is, in words ("custom_id that succeeded", "item passed")
    currency: str
    hourly_rate: str
    seconds: float | None = None
    spend: str | None = None
    attempts: int = 0
    succeeded: int = 0
    failed: int = 0
    retries: int = 0
    cost_per_success: str | None = None
    not_measured: str = ""  # "not measured: <reason>" when cost_per_success is None
    how: str = ""  # the arithmetic, in words
    # An interruptible pool's tax, in hourly_rate (fleet/interruption.py); "" otherwise.
    interruption: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def task_cost(*, pool: Any, unit: str, seconds: float | None, succeeded: int, failed: int = 0,
              retries: int = 0, attempts: int | None = None,
              busy: str = "busy time", tax: Any = None) -> TaskCost:
    """A TaskCost of `pool` (a Pool) from its counts: `seconds` the pool was busy (None: not
    started), `attempts` every request sent (default: succeeded + failed + retries). The
    rate is the pool's with its interruption tax (fleet/interruption.py), as in every cost
    figure of the pool; an interruptible pool without a measured tax is not measured. `tax`:
    the pool's effective_rate when the caller has read it already (a page of many)."""
    from fleetctl.fleet.interruption import effective_rate
    from fleetctl.fleet.models import money

    tax = tax if tax is not None else effective_rate(pool)
    rate = tax.effective_rate if tax.effective_rate is not None else tax.hourly_rate
    currency = pool.currency
    out = TaskCost(pool=pool.name, unit=unit, currency=currency, hourly_rate=money(rate),
                   seconds=seconds, succeeded=succeeded, failed=failed, retries=retries,
                   attempts=(succeeded + failed + retries) if attempts is None else attempts,
                   interruption=tax.text)
    if tax.not_measured:
        out.not_measured = tax.not_measured
        return out
    if seconds is None:
        out.not_measured = f"not measured: no {busy} yet (it has not started)"
        return out
    if rate <= 0:
        out.not_measured = (f"not measured: {pool}'s hourly rate is 0 — set its "
                            f"node_hourly_rate (Fleet → the pool → Edit) to price it")
        return out
    spent = spend(rate, seconds, places=TASK_PLACES)
    out.spend = str(spent)
    if succeeded <= 0:
        out.not_measured = (f"not measured: no {unit} yet ({out.attempts} attempts, "
                            f"{failed} failed); {spent} {currency} spent")
        return out
    out.cost_per_success = str(cost_per_success(spent, succeeded))
    taxed = f" ({tax.text})" if tax.interruptible else ""
    out.how = (f"{money(rate)} {currency}/h{taxed} × {seconds:,.0f} s {busy} = {spent} "
               f"{currency} ÷ "
               f"{succeeded:,} {unit} ({out.attempts:,} attempts: {failed:,} failed, "
               f"{retries:,} retries)")
    return out
