"""The capacity split of a route, read only: each pool that may carry weight on it gets a
share in proportion to its SLO-qualified output tokens/s (traffic/capacity.py), with the
reason naming each pool's benchmark run, and every pool left out said with why
(docs/traffic.md, "Capacity splits").

A pool takes part when it may carry weight on the route now: it serves the model inside the
route's pin (`pools_eligible`), it is healthy, its migration plan's stage allows live weight
on this route (traffic.policy), and it has a capacity figure. The others are kept at 0 % and
named. No split is offered (`refusal`) when the route's primary has no figure or may not
carry weight: a capacity split that moves all traffic off a primary never benchmarked is a
guess, not a measurement. The service (`services.route_capacity_split_apply`) stores this
split as a revision of kind `capacity`, and the split checks run again under its lock."""

from __future__ import annotations

from dataclasses import dataclass, field

from fleetctl.fleet.models import Pool
from fleetctl.traffic import policy, selectors
from fleetctl.traffic.capacity import (
    PoolCapacity,
    live_streams,
    pool_capacities,
    proportional_weights,
)
from fleetctl.traffic.models import Route


@dataclass(frozen=True)
class CapacityRow:
    """One pool of the route: its capacity, what it carries now, its weight now and the
    suggested one (basis points), and why it has no share when it has none."""

    pool: str
    capacity: PoolCapacity
    live_streams: int | None  # None: no gateway sampled it lately (unknown, not zero)
    current_bp: int
    suggested_bp: int
    left_out: str = ""  # why the pool gets no share of the capacity split ("" when it does)

    @property
    def current_percent(self) -> float:
        return self.current_bp / 100

    @property
    def suggested_percent(self) -> float:
        return self.suggested_bp / 100


@dataclass(frozen=True)
class CapacitySplit:
    route: str
    model_id: str
    revision: int  # the route's revision this was read at (the base of an apply)
    rows: list[CapacityRow] = field(default_factory=list)
    weights: dict[str, int] = field(default_factory=dict)  # suggested, basis points
    reason: str = ""  # the revision's reason: each pool's figure and run, and what is left out
    refusal: str = ""  # why no split is offered ("" when one is)

    @property
    def unchanged(self) -> bool:
        return bool(self.weights) and all(
            row.current_bp == self.weights.get(row.pool, 0) for row in self.rows)


def _left_out(pool: Pool, route: Route, capacity: PoolCapacity, eligible: set[str]) -> str:
    if pool.name not in eligible:
        where = f" inside the {route.residency} pin" if route.residency else ""
        return f"it does not serve {route.model_id}{where} any more"
    refusal = policy.live_weight_refusal(pool, route)
    if refusal:
        return refusal
    if pool.health_state != Pool.Health.HEALTHY:
        return f"it is {pool.health_state}"
    if not capacity.known:
        return capacity.source
    return ""


def route_capacity_split(*, route: Route) -> CapacitySplit:
    """The capacity split of `route` as things stand now (see the module's docstring)."""
    current = selectors.revision_current(route=route)
    weights_now = dict(current.weights) if current else {}
    eligible = selectors.pools_eligible(route=route)
    pools = selectors.ramp_pools(eligible=eligible, holding=set(weights_now))
    capacities = pool_capacities(route.model_id, [p for p in pools if p.name in eligible])
    streams = live_streams([p.name for p in pools])
    why = {}
    for pool in pools:
        capacity = capacities.get(pool.name) or PoolCapacity(pool=pool.name)
        capacities[pool.name] = capacity
        why[pool.name] = _left_out(pool, route, capacity, eligible)
    usable = {name: float(capacities[name].tokens_per_s or 0)
              for name, reason in why.items() if not reason}
    primary = route.primary_pool.name
    refusal = ""
    if primary not in usable:
        known = primary in capacities and capacities[primary].known
        problem = why.get(primary) or "it does not serve the route"
        refusal = f"No capacity split for {route.name}: its primary {primary} " + (
            f"may not carry weight now ({problem})." if known else
            f"has no capacity figure to split by ({problem}). Benchmark it (Benchmarks → "
            f"New run, a concurrency sweep of {route.model_id}) first.")
    suggested = {} if refusal else proportional_weights(usable)
    rows = [CapacityRow(pool=pool.name, capacity=capacities[pool.name],
                        live_streams=streams.get(pool.name),
                        current_bp=int(weights_now.get(pool.name, 0)),
                        suggested_bp=suggested.get(pool.name, 0), left_out=why[pool.name])
            for pool in pools]
    return CapacitySplit(route=route.name, model_id=route.model_id,
                         revision=route.revision_number, rows=rows, weights=suggested,
                         reason=_reason(rows) if suggested else "", refusal=refusal)


def _reason(rows: list[CapacityRow]) -> str:
    """"Capacity split (SLO-qualified output tokens/s): h200-us-east 2,400 tok/s (benchmark
    run 12 on 2026-12-01) → 66.67 %; … Left at 0 %: tpu-v5e (no benchmark …)."""
    shares = "; ".join(
        f"{row.pool} {row.capacity.tokens_per_s:,.0f} tok/s ({row.capacity.source}) → "
        f"{row.suggested_bp / 100:g} %" for row in rows if row.suggested_bp)
    text = f"Capacity split (SLO-qualified output tokens/s): {shares}."
    left = [f"{row.pool} ({row.left_out})" for row in rows if row.left_out]
    if left:
        text += f" Left at 0 %: {'; '.join(left)}."
    return text
