"""Assertions that hold on a shared, loaded machine (CI runs the suite on 2 cores next to
Envoy, HAProxy, nginx, a Celery worker, simulators and Chromium).

- `binomial_tolerance`: how far a count of random routing decisions may stray from its
  expectation, exactly, for a chosen false-failure probability.
- `best_of`: a timing measurement repeated when load spoiled it. Load can spoil one
  measurement; a real fault spoils every one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

FALSE_FAILURE = 1e-6


def binomial_tolerance(n: int, p: float, false_failure: float = FALSE_FAILURE) -> float:
    """The smallest k such that a Binomial(n, p) count lands outside n·p ± k with
    probability at most `false_failure` (both tails, exact; ~5 sigma for 1e-6)."""
    assert n > 0 and 0 < p < 1
    log_p, log_q = math.log(p), math.log1p(-p)
    pmf = [math.exp(math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
                    + i * log_p + (n - i) * log_q) for i in range(n + 1)]
    mean = n * p
    by_distance = sorted(range(n + 1), key=lambda i: abs(i - mean), reverse=True)
    outside = 0.0
    for i in by_distance:  # farthest first: grow the rejected tails while they stay rare
        if outside + pmf[i] > false_failure:
            return abs(i - mean)
        outside += pmf[i]
    return 0.0


def best_of(attempts: int, measure: Callable[[], str | None]) -> None:
    """Run a timing measurement up to `attempts` times. `measure` runs the scenario once,
    asserts whatever does not depend on timing (those assertions fail at once), and returns
    None when its timing checks held, or what missed. The test fails only if every
    attempt missed, and says how each one did."""
    misses = []
    for n in range(1, attempts + 1):
        miss = measure()
        if miss is None:
            return
        misses.append(f"attempt {n}: {miss}")
    raise AssertionError("the timing missed in every attempt:\n" + "\n".join(misses))
