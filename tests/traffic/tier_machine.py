"""A sibling of residency_machine.py for context tiers (issue 28): random sequences of tier
edits on routes (set, cleared), pools' registered context (the pool-model entry) and reported
context (what the health probe records of their servers), and split changes that add or
take away a pool's weight; after every step, the rendered Envoy config (each gateway's
desired state → its route entries) is read back and judged on its own terms, from the
stored rows, never through fleetctl/traffic/tiers.py:

- every pool a tier's entry names (with weight or at 0, which a ramp could raise) is
  registered for at least the tier's context and its servers do not report less: never a
  pool below the tier;
- on a pinned route, every pool any of its entries names is in the route's jurisdiction;
- a tier's entry never names a pool the route's own entry does not (a tier only narrows);
- a tier no eligible pool with weight can serve answers itself: 413 when it rejects, 503
  otherwise; and a tier one can serve is routed, not refused;
- the entry for prompts of unknown size goes where the last tier goes.

Refusals are part of the game: a tier no pool can serve (400), a context lowered under a
tier a pool carries (409), a split that leaves the pin (400) are expected answers, and the
state after them must still hold. The test: tests/traffic/test_tier_property.py."""

from __future__ import annotations

import contextlib
from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction
from hypothesis import event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from fleetctl.core.errors import DomainError
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.fleet.services import (
    pool_create,
    pool_health_record,
    pool_model_create,
    pool_model_update,
    region_create,
)
from fleetctl.traffic import selectors
from fleetctl.traffic import services as traffic
from fleetctl.traffic.gateways.base import PROMPT_TOKENS_UNKNOWN
from fleetctl.traffic.gateways.envoy import render as envoy_config
from fleetctl.traffic.gateways.envoy.fallback import pool_of
from fleetctl.traffic.gateways.envoy.routes import ESTIMATE_MARGIN_PCT, INT64_MAX, TIER_METADATA
from fleetctl.traffic.models import ContextTier, Gateway, Route
from tests.conftest import SYSTEM

MODEL = "llama-3.1-8b-instruct"
PROMPT_HEADER = "x-fleetctl-prompt-tokens"
CONTEXTS = [4096, 8192, 16384, 32768, 131072]
# name -> (jurisdiction, registered context): two sizes in each jurisdiction, one large.
POOLS = {"us-s": ("US", 8192), "us-l": ("US", 131072), "eu-s": ("EU", 8192),
         "eu-m": ("EU", 32768), "eu-l": ("EU", 131072)}
# name -> (residency, primary)
ROUTES = {"open": ("", "us-l"), "eu": ("EU", "eu-l"), "us": ("US", "us-l")}
BEHAVIOURS = ["failover", "failover-class", "pinned", "reject", "queue"]

OUTCOMES = (ValidationError, DomainError)  # refusals the machine expects now and then


def _tier(bound: int | None, behaviour: str) -> dict[str, Any]:
    tier: dict[str, Any] = {"behaviour": behaviour}
    if bound is not None:
        tier["max_prompt_tokens"] = bound
    if behaviour == "queue":
        tier.update(queue_max=8, retry_after_s=2)
    return tier


tiers_strategy = st.builds(
    lambda bounds, behaviours, open_last: [
        _tier(None if open_last and i == len(bounds) - 1 else b, behaviours[i % len(behaviours)])
        for i, b in enumerate(bounds)],
    st.lists(st.sampled_from([1000, 4096, 8192, 16384, 32768, 65536, 131072]), min_size=1,
             max_size=4, unique=True).map(sorted),
    st.lists(st.sampled_from(BEHAVIOURS), min_size=1, max_size=4),
    st.booleans())


def build_world() -> Gateway:
    """The pools (POOLS), routes (ROUTES) and an Envoy gateway row carrying them all."""
    regions = {j: region_create(actor=SYSTEM, code=f"t-{j.lower()}", name=j,
                                jurisdiction=j) for j in ("US", "EU")}
    for i, (name, (jurisdiction, context)) in enumerate(POOLS.items()):
        pool = pool_create(actor=SYSTEM, name=name, runtime="cuda", accelerator="H100",
                           region=regions[jurisdiction], max_context_tokens=131072,
                           node_hourly_rate="1",
                           base_urls=[f"http://127.0.0.1:{29200 + i}"])
        pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL,
                          max_context_tokens=context)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    routes = [traffic.route_create(actor=SYSTEM, name=name, model_id=MODEL,
                                   residency=residency,
                                   primary_pool=Pool.objects.get(name=primary))
              for name, (residency, primary) in ROUTES.items()]
    return traffic.gateway_create(actor=SYSTEM, name="tier-edge", kind="envoy",
                                  admin_address="http://127.0.0.1:9",
                                  options={"config_dir": "/tmp/tier-machine"},
                                  routes=routes)


class TierMachine(RuleBasedStateMachine):
    """Each sequence runs in a savepoint of the test's transaction, rolled back at its end,
    so every sequence starts from an empty registry."""

    gateway: Gateway

    def __init__(self) -> None:
        super().__init__()
        self._savepoint = transaction.atomic()
        self._savepoint.__enter__()

    def teardown(self) -> None:
        transaction.set_rollback(True)
        self._savepoint.__exit__(None, None, None)

    @initialize()
    def build(self) -> None:
        self.gateway = build_world()

    # --- rules ------------------------------------------------------------------------------

    @rule(route=st.sampled_from(sorted(ROUTES)), tiers=tiers_strategy)
    def set_tiers(self, route: str, tiers: list[dict[str, Any]]) -> None:
        try:
            traffic.route_tiers_set(actor=SYSTEM, route=Route.objects.get(name=route),
                                    tiers=tiers)
            event("tiers set")
        except OUTCOMES:
            event("tiers refused")

    @rule(route=st.sampled_from(sorted(ROUTES)))
    def clear_tiers(self, route: str) -> None:
        traffic.route_tiers_set(actor=SYSTEM, route=Route.objects.get(name=route), tiers=[])

    @rule(pool=st.sampled_from(sorted(POOLS)), context=st.sampled_from(CONTEXTS))
    def register_context(self, pool: str, context: int) -> None:
        entry = PoolModel.objects.get(pool__name=pool, model_id=MODEL)
        with contextlib.suppress(OUTCOMES):
            pool_model_update(actor=SYSTEM, entry=entry, max_context_tokens=context)

    @rule(pool=st.sampled_from(sorted(POOLS)),
          reported=st.one_of(st.none(), st.sampled_from(CONTEXTS)))
    def report_context(self, pool: str, reported: int | None) -> None:
        """What the servers report is never refused: a pool reporting less leaves the tier."""
        found = Pool.objects.get(name=pool)
        lengths = {MODEL: reported} if reported is not None else {}
        pool_health_record(pool_id=found.pk, ok=True, status_code=200, latency_ms=1.0,
                           reported={"max_model_len": lengths})

    @rule(route=st.sampled_from(sorted(ROUTES)),
          shares=st.dictionaries(st.sampled_from(sorted(POOLS)), st.integers(0, 100),
                                 min_size=1, max_size=4))
    def set_weights(self, route: str, shares: dict[str, int]) -> None:
        """Add or take away weight (a pool at 0 is listed, not removed); a split leaving the
        pin, or summing to nothing, is refused."""
        total = sum(shares.values())
        if total == 0:
            return
        weights = {pool: share * 100 / total for pool, share in shares.items()}
        rounded = {pool: round(w, 2) for pool, w in weights.items()}
        top = max(rounded, key=lambda p: rounded[p])
        rounded[top] = round(rounded[top] + 100 - sum(rounded.values()), 2)
        found = Route.objects.get(name=route)
        with contextlib.suppress(OUTCOMES):
            traffic.revision_create(actor=SYSTEM, route=found, weights=rounded,
                                    base_revision=found.revision_number, reason="fuzz",
                                    force=True)

    # --- the invariants ---------------------------------------------------------------------

    @invariant()
    def rendered_tiers_hold(self) -> None:
        problems = rendered_problems(Gateway.objects.get(pk=self.gateway.pk))
        assert not problems, "\n".join(problems)
        event(f"routes with tiers: {ContextTier.objects.values('route').distinct().count()}")


def _context_of(pool: Pool) -> tuple[int, int | None]:
    """(registered, reported) for MODEL, read from the rows."""
    entry = PoolModel.objects.get(pool=pool, model_id=MODEL)
    lengths = (pool.reported or {}).get("max_model_len") or {}
    reported = lengths.get(MODEL)
    return (min(pool.max_context_tokens, entry.max_context_tokens),
            reported if isinstance(reported, int) else None)


def _serves(pool: Pool, needed: int) -> bool:
    registered, reported = _context_of(pool)
    return registered >= needed and (reported is None or reported >= needed)


def _clusters(entry: dict[str, Any]) -> dict[str, int]:
    weighted = (entry.get("route") or {}).get("weighted_clusters") or {}
    return {c["name"]: c["weight"] for c in weighted.get("clusters", [])}


def _range(entry: dict[str, Any]) -> tuple[int, int] | str | None:
    for header in entry["match"].get("headers", []):
        if header["name"] == PROMPT_HEADER:
            if "range_match" in header:
                return header["range_match"]["start"], header["range_match"]["end"]
            return str(header["string_match"]["exact"])
    return None


def _tries(name: str, clusters: dict[str, dict[str, Any]]) -> list[str]:
    """The pools a weighted cluster sends to, in order: a pool's own cluster or a queue tier's
    copy of it is one pool; a fallback (aggregate) cluster lists the pools it tries."""
    cluster = clusters[name]
    kind = (cluster.get("cluster_type") or {})
    if kind.get("name") == "envoy.clusters.aggregate":
        return [pool_of(c) for c in kind["typed_config"]["clusters"]]
    return [pool_of(name)]


def _cut(bound: int, following_has_pools: bool) -> int:
    """The largest estimate a bounded tier takes (routes.tier_cut, restated from its doc)."""
    return bound * 100 // (100 + ESTIMATE_MARGIN_PCT) if following_has_pools else bound


def _serving(route: Route, split: dict[str, int], pools: dict[str, Pool], tier: ContextTier,
             low: int) -> list[str]:
    """The pools with weight that may serve the tier (its context, the route's pin)."""
    needed = tier.max_prompt_tokens or low + 1
    return [p for p, w in split.items() if w > 0 and _serves(pools[p], needed)
            and (not route.residency or pools[p].region.jurisdiction == route.residency)]


def rendered_problems(gateway: Gateway) -> list[str]:
    """What is wrong with the gateway's rendered route entries, judged from the rows."""
    desired = selectors.gateway_desired_state(gateway=gateway)
    rendered = envoy_config.render(desired)
    entries = rendered.route_config["virtual_hosts"][0]["routes"]
    pools = {p.name: p for p in Pool.objects.select_related("region")}
    problems: list[str] = []
    for route in Route.objects.filter(gateways=gateway):
        tiers = list(ContextTier.objects.filter(route=route))
        own = [e for e in entries if e["name"] == route.name and _range(e) is None]
        split = _clusters(own[0]) if own else {}
        own_pools = set(split)
        mine = [e for e in entries if _range(e) is not None and (
            e["name"] == route.name or e["name"].startswith(f"fleetctl:tier:{route.name}:"))]
        for entry in [*own, *mine]:
            for cluster in _clusters(entry):
                for name in _tries(cluster, rendered.clusters):
                    where = pools[name].region.jurisdiction
                    if route.residency and where != route.residency:
                        problems.append(f"{route.name} (pinned {route.residency}): entry "
                                        f"names {name} in {where}")
        if not tiers or not split:
            if mine:
                problems.append(f"{route.name}: tier entries without tiers or weights")
            continue
        above = 0
        bounds = []
        for tier in tiers:
            bounds.append((tier, above))
            above = tier.max_prompt_tokens or above
        if len(mine) != len(tiers) + 1:
            problems.append(f"{route.name}: {len(mine)} tier entries for {len(tiers)} tiers")
            continue
        cuts = [(_cut(tier.max_prompt_tokens,
                      bool(_serving(route, split, pools, *bounds[i + 1])))
                 if tier.max_prompt_tokens is not None and i + 1 < len(tiers) else None)
                for i, (tier, _) in enumerate(bounds)]
        for index, entry in enumerate(mine):
            tier, low = bounds[min(index, len(tiers) - 1)]
            label = PROMPT_TOKENS_UNKNOWN if index == len(tiers) else str(index)
            needed = tier.max_prompt_tokens or low + 1
            eligible_with_weight = [
                p for p, w in split.items() if w > 0 and _serves(pools[p], needed)
                and (not route.residency or pools[p].region.jurisdiction == route.residency)]
            clusters = _clusters(entry)
            last = index >= len(tiers) - 1
            below = cuts[index - 1] if 0 < index < len(tiers) else None
            want: tuple[int, int] | str = (
                PROMPT_TOKENS_UNKNOWN if index == len(tiers) else
                (0 if index == 0 else (below if below is not None else low) + 1,
                 INT64_MAX if last else (cuts[index] or 0) + 1))
            if _range(entry) != want:
                problems.append(f"{route.name} tier {label}: matches {_range(entry)}, not "
                                f"{want}")
            if "direct_response" in entry:
                status = entry["direct_response"]["status"]
                due = 413 if tier.behaviour == ContextTier.Behaviour.REJECT else 503
                if status != due:
                    problems.append(f"{route.name} tier {label}: answers {status}, not {due}")
                if eligible_with_weight:
                    problems.append(f"{route.name} tier {label}: refused ({status}) though "
                                    f"{eligible_with_weight} may serve it")
                continue
            if not eligible_with_weight:
                problems.append(f"{route.name} tier {label}: routed to {clusters} though no "
                                f"pool with weight may serve it (due: its own answer)")
            for cluster in clusters:
                tries = _tries(cluster, rendered.clusters)
                chosen = tries[0]
                if len(tries) > 1 and tier.behaviour in (ContextTier.Behaviour.PINNED,
                                                         ContextTier.Behaviour.REJECT):
                    problems.append(f"{route.name} tier {label} ({tier.behaviour}): falls "
                                    f"over from {chosen} to {tries[1:]}")
                for name in tries:
                    if not _serves(pools[name], needed):
                        problems.append(f"{route.name} tier {label}: {name} "
                                        f"({_context_of(pools[name])}) is below the tier's "
                                        f"{needed} tokens")
                    if name not in own_pools:
                        problems.append(f"{route.name} tier {label}: {name} is not in the "
                                        f"route's own split {sorted(own_pools)}")
                for name in tries[1:]:
                    if split.get(name, 0) <= 0:
                        problems.append(f"{route.name} tier {label}: falls over to {name}, "
                                        f"which the split drained")
                    if (pools[name].region.jurisdiction
                            != pools[chosen].region.jurisdiction):
                        problems.append(f"{route.name} tier {label}: falls over from "
                                        f"{chosen} across a border to {name}")
            meta = ((entry.get("metadata") or {}).get("filter_metadata") or {}).get(
                TIER_METADATA) or {}
            if meta.get("tier") != min(index, len(tiers) - 1) or meta.get("unknown") != (
                    index == len(tiers)):
                problems.append(f"{route.name} tier {label}: metadata {meta}")
        if _clusters(mine[-1]) != _clusters(mine[-2]) or (
                "direct_response" in mine[-1]) != ("direct_response" in mine[-2]):
            problems.append(f"{route.name}: unknown size does not go where the last tier goes")
    return problems
