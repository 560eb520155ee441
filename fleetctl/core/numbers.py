"""Rounding measured figures for people and API answers. A duration computed from two
timestamps carries binary noise (41.223000000000006 ms); answers give it to the precision it
was measured at, in one place, rather than field by field."""

from __future__ import annotations

# Durations: a tenth of a millisecond (timestamps are microseconds; a gateway call is ms).
MS_PLACES = 1
# Rates and other derived figures in charts and answers.
FIGURE_PLACES = 3


def round_ms(value: float | None) -> float | None:
    """A duration in milliseconds to 0.1 ms; None stays None."""
    return None if value is None else round(float(value), MS_PLACES)


def round_figure(value: float | None, places: int = FIGURE_PLACES) -> float | None:
    return None if value is None else round(float(value), places)
