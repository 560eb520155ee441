"""Which pools may serve each context tier of a route: computed from the registry and what
the pools report, never stored.

A pool may serve a tier of a route when, in this order (the first reason that applies is
the one shown; residency first, and it fails closed):

1. it sits in the route's jurisdiction (a pinned route);
2. its latency class is the route's or a faster one (interactive < standard < batch: a
   batch route may use an interactive pool, never the other way round; a route of any
   class takes every class);
3. the stage rules allow it live weight on the route (`policy.live_weight_refusals`: a
   migration plan's candidate below stage 4 carries none);
4. it serves the tier's largest prompt: the context it is registered for — the smaller of
   the pool's and its model entry's `max_context_tokens` — is at least the tier's bound,
   and what its servers report (`Pool.reported["max_model_len"][model]`, recorded by the
   health probe) is not below it. A pool whose registry claims more than its servers serve
   is placed by what they serve. The open-ended last tier needs more than the bound below.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.traffic import policy
from fleetctl.traffic.models import ContextTier, Route

LATENCY_RANK: dict[str, int] = {"interactive": 0, "standard": 1, "batch": 2}


@dataclass(frozen=True)
class Candidate:
    """A pool that serves the route's model, and what it may serve on the route."""

    pool: Pool
    registered: int  # tokens: min(pool.max_context_tokens, entry.max_context_tokens)
    reported: int | None  # the servers' max_model_len for the model; None: not reported
    refusal: str | None  # residency, latency class or stage: it may serve no tier here

    @property
    def serves(self) -> int:
        """The context it can be given: what is registered, unless the servers report less."""
        return self.registered if self.reported is None else min(self.registered,
                                                                 self.reported)

    @property
    def mismatch(self) -> bool:
        return self.reported is not None and self.reported < self.registered

    def context_refusal(self, needed: int) -> str | None:
        if self.registered < needed:
            return f"context too small: registered for {self.registered:,} tokens"
        if self.reported is not None and self.reported < needed:
            return (f"reports less than registered: its servers report max_model_len "
                    f"{self.reported:,} (registered {self.registered:,})")
        return None


@dataclass
class TierPools:
    """One tier of a route with the pools that may serve it, and why each other may not."""

    tier: ContextTier
    index: int
    above: int  # the bound of the tier below (0 for the first): this tier's prompts are larger
    eligible: list[Candidate] = field(default_factory=list)
    others: list[tuple[Candidate, str]] = field(default_factory=list)
    # What the gateways' logs say this tier's entry carried lately (`route_tier_live`):
    # {"requests": n, "pools": [{"pool", "requests", "share"}]}; None when nothing was read.
    live: dict[str, Any] | None = None

    @property
    def needed(self) -> int:
        """The context a pool needs for this tier: its bound, or one more than the tier
        below's for the open-ended last tier."""
        bound = self.tier.max_prompt_tokens
        return bound if bound is not None else self.above + 1

    @property
    def refuses_all(self) -> bool:
        """The open-ended last tier with `reject` and no pool: every prompt above the last
        bound is refused with 413 (never sent to a smaller pool)."""
        return (self.tier.max_prompt_tokens is None and not self.eligible
                and self.tier.behaviour == ContextTier.Behaviour.REJECT)

    @property
    def eligible_names(self) -> list[str]:
        return [c.pool.name for c in self.eligible]


def _route_refusal(route: Route, pool: Pool, stage: str | None) -> str | None:
    if route.residency and pool.region.jurisdiction != route.residency:
        return (f"other jurisdiction: {pool.region.jurisdiction}, the route is pinned to "
                f"{route.residency}")
    if route.latency_class and (LATENCY_RANK.get(pool.latency_class, 99)
                                > LATENCY_RANK.get(route.latency_class, 99)):
        return (f"latency class {pool.latency_class}, slower than the route's "
                f"{route.latency_class}")
    if stage:
        return f"stage: {stage}"
    return None


def candidates(route: Route, *, context: dict[int, int] | None = None,
               entries: Sequence[PoolModel] | None = None) -> list[Candidate]:
    """Every pool serving the route's model, by name. `context`: {pool id: tokens} a pool's
    registered context would be after an edit (the guard that refuses lowering it).
    `entries`: the model's PoolModel rows (pool and region joined, by pool name), when the
    caller read them for many routes at once."""
    found = []
    if entries is None:
        entries = list(PoolModel.objects.filter(model_id=route.model_id)
                       .select_related("pool__region").order_by("pool__name"))
    # The stage rules for every pool at once (policy.live_weight_refusals), not a read a pool.
    stages = policy.live_weight_refusals([entry.pool for entry in entries], route)
    for entry in entries:
        pool = entry.pool
        registered = min(pool.max_context_tokens, entry.max_context_tokens)
        if context and pool.pk in context:
            registered = min(registered, context[pool.pk])
        lengths = (pool.reported or {}).get("max_model_len") or {}
        reported = lengths.get(route.model_id)
        found.append(Candidate(pool=pool, registered=registered,
                               reported=reported if isinstance(reported, int) else None,
                               refusal=_route_refusal(route, pool, stages.get(pool.pk))))
    return found


def tier_pools(route: Route, tiers: Sequence[ContextTier], *,
               found: list[Candidate] | None = None) -> list[TierPools]:
    """Each tier (ordered by bound, the open one last) with its eligible pools."""
    pools = candidates(route) if found is None else found
    views = []
    above = 0
    for index, tier in enumerate(tiers):
        view = TierPools(tier=tier, index=index, above=above)
        for candidate in pools:
            why = candidate.refusal or candidate.context_refusal(view.needed)
            if why:
                view.others.append((candidate, why))
            else:
                view.eligible.append(candidate)
        views.append(view)
        above = tier.max_prompt_tokens or above
    return views


def route_tiers(route: Route) -> list[ContextTier]:
    return list(ContextTier.objects.filter(route=route))


def route_tier_pools(route: Route) -> list[TierPools]:
    """The route's tiers with their pools; none read when the route was fetched knowing it
    has none (selectors.route_get's `has_context_tiers`)."""
    if getattr(route, "has_context_tiers", True) is False:
        return []
    tiers = route_tiers(route)
    return tier_pools(route, tiers) if tiers else []


def route_tier_live(route: Route, views: Sequence[TierPools]) -> dict[str, Any]:
    """Each tier's live share per pool over the last 15 minutes, from telemetry (which sits
    above traffic and provides it: core/panels.py), set on `views` (`live`) and returned:
    {"minutes", "since", "until", "tiers": {"0": {...}, "unknown": {...}}}. {"tiers": {}}
    when no telemetry is installed or nothing was logged."""
    from fleetctl.core.panels import provided

    live = provided("traffic.tier_live", route.name) if views else {}
    live = dict(live or {})
    live.setdefault("tiers", {})
    for view in views:
        view.live = live["tiers"].get(str(view.index))
    return live
