"""What a pool's hours cost per 1M output tokens: the one formula the benchmark (a pool's
cost) and the batch soak (the measured cost arbitrage) both use."""

from __future__ import annotations

from decimal import ROUND_HALF_UP, Decimal


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
