"""A route's context tiers: set all of them in one audited call, and the guard fleet asks
before a registry edit lowers a pool's context (traffic/apps.py registers it)."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.db import transaction

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import NotFoundError
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.traffic import selectors
from fleetctl.traffic.models import ContextTier, Route
from fleetctl.traffic.tiers import TierPools, candidates, route_tiers, tier_pools

MAX_TIERS = 8
MAX_PROMPT_TOKENS = 10_000_000
MAX_QUEUE = 100_000
MAX_RETRY_AFTER_S = 3_600
TIER_KEYS = ("max_prompt_tokens", "behaviour", "queue_max", "retry_after_s")
BEHAVIOURS = [value for value, _ in ContextTier.Behaviour.choices]


def tier_dict(tier: ContextTier) -> dict[str, Any]:
    return {key: getattr(tier, key) for key in TIER_KEYS}


def _whole(value: Any, *, lo: int, hi: int) -> str | None:
    """Why `value` is not a whole number in [lo, hi], or None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"Give a whole number from {lo:,} to {hi:,}; got {str(value)[:40]!r}."
    if not lo <= value <= hi:
        return f"Give a whole number from {lo:,} to {hi:,}; got {value:,}."
    return None


def _parse_tier(index: int, entry: Any, last: bool, errors: dict[str, list[str]]
                ) -> ContextTier | None:
    where = f"tiers[{index}]"
    if not isinstance(entry, dict) or not entry:
        errors[where] = ["An empty tier: give an object with its behaviour (one of "
                         f"{', '.join(BEHAVIOURS)}) and its max_prompt_tokens (only the last "
                         "tier may leave it out: every prompt above the last bound)."]
        return None
    found: dict[str, list[str]] = {}
    for key in entry:
        if key not in TIER_KEYS:
            found[f"{where}.{str(key)[:40]}"] = [
                f"Unknown field; a tier has {', '.join(TIER_KEYS)}."]
    behaviour = entry.get("behaviour")
    if behaviour is None:
        found[f"{where}.behaviour"] = [f"Required: one of {', '.join(BEHAVIOURS)}."]
    elif not isinstance(behaviour, str) or behaviour not in BEHAVIOURS:
        found[f"{where}.behaviour"] = [f"Unknown behaviour {str(behaviour)[:40]!r}: one of "
                                       f"{', '.join(BEHAVIOURS)}."]
    bound = entry.get("max_prompt_tokens")
    if bound is None:
        if not last:
            found[f"{where}.max_prompt_tokens"] = [
                "Only the last tier may be open-ended (no max_prompt_tokens): every tier "
                "below it needs a bound."]
    elif problem := _whole(bound, lo=1, hi=MAX_PROMPT_TOKENS):
        found[f"{where}.max_prompt_tokens"] = [problem]
    for key, hi in (("queue_max", MAX_QUEUE), ("retry_after_s", MAX_RETRY_AFTER_S)):
        value = entry.get(key)
        if behaviour == ContextTier.Behaviour.QUEUE:
            if value is None:
                found[f"{where}.{key}"] = [
                    "Required for a queue tier: a queue is bounded, and a full one answers "
                    "429 with Retry-After."]
            elif problem := _whole(value, lo=1, hi=hi):
                found[f"{where}.{key}"] = [problem]
        elif value is not None:
            found[f"{where}.{key}"] = [
                f"Only a queue tier takes {key} (this tier's behaviour is "
                f"{str(behaviour)[:40]})."]
    errors.update(found)
    if found:
        return None
    return ContextTier(max_prompt_tokens=bound, behaviour=str(behaviour),
                       queue_max=entry.get("queue_max"), retry_after_s=entry.get("retry_after_s"))


def parse_tiers(tiers: Any) -> list[ContextTier]:
    """The tiers as given (a list, smallest bound first, the open-ended one last), checked
    for their own arithmetic: 400 naming the tier (`tiers[1].max_prompt_tokens`)."""
    if not isinstance(tiers, list):
        raise ValidationError({"tiers": [
            "Give the tiers as a list, smallest bound first, e.g. [{\"max_prompt_tokens\": "
            "8192, \"behaviour\": \"failover\"}, {\"behaviour\": \"reject\"}]; [] removes "
            "them."]})
    if len(tiers) > MAX_TIERS:
        raise ValidationError({"tiers": [f"At most {MAX_TIERS} tiers; got {len(tiers)}."]})
    errors: dict[str, list[str]] = {}
    parsed = [_parse_tier(i, entry, i == len(tiers) - 1, errors)
              for i, entry in enumerate(tiers)]
    if errors:
        raise ValidationError(errors)
    bounds: dict[int, int] = {}
    previous: tuple[int, int] | None = None
    for index, tier in enumerate(parsed):
        assert tier is not None
        bound = tier.max_prompt_tokens
        if bound is None:
            continue
        where = f"tiers[{index}].max_prompt_tokens"
        if bound in bounds:
            errors[where] = [f"{bound:,} is tiers[{bounds[bound]}]'s bound too: two tiers "
                             f"cannot share a bound."]
        elif previous is not None and bound < previous[1]:
            errors[where] = [f"{bound:,} is below tiers[{previous[0]}]'s {previous[1]:,}: "
                             f"tiers may not overlap; list them from the smallest bound up."]
        bounds.setdefault(bound, index)
        previous = (index, bound)
    if errors:
        raise ValidationError(errors)
    return [tier for tier in parsed if tier is not None]


def _unservable(route: Route, view: TierPools) -> str:
    why = "; ".join(f"{c.pool.name}: {reason}" for c, reason in view.others)
    return (f"No pool can serve tier {view.tier.label} of route {route.name} (needs "
            f"{view.needed:,} tokens of {route.model_id}): "
            f"{why or f'no pool serves {route.model_id}'}. Lower the bound, or make "
            f"the last tier `reject` (413 above the last bound).")


def _gateways_refusal(route: Route) -> str | None:
    """Why the route's gateways cannot hold tiers: a gateway whose kind cannot route by
    prompt size would send every request by the split (a silent partial), so tiers are
    refused while one carries the route. None when every gateway can."""
    from fleetctl.traffic.gateways import registry

    cannot = []
    for gateway in route.gateways.order_by("name"):
        kind = registry.find(gateway.kind)
        if kind is not None and not kind.supports_context_tiers:
            cannot.append(f"{gateway.name} ({kind.label})")
    if not cannot:
        return None
    return (f"Route {route.name} is carried by gateway(s) that cannot route by prompt size: "
            f"{', '.join(cannot)}. Only Envoy gateways enforce context tiers; take the route "
            f"off those gateways first, or keep it without tiers.")


def route_tiers_set(*, actor: Actor, route: Route, tiers: Any) -> list[TierPools]:
    """Replace the route's context tiers (fleet-manage), audited with before and after.
    Refused with 400 naming the tier when they overlap, repeat a bound, leave an entry
    empty, name an unknown behaviour, or when no pool can serve a tier (only the open-ended
    last tier may have none, and only as `reject`). Answers each tier with its eligible
    pools."""
    actor.require(roles.FLEET_MANAGE, action="route.tiers", target=route)
    parsed = parse_tiers(tiers)
    with transaction.atomic():
        locked = Route.objects.select_for_update().filter(pk=route.pk).first()
        if locked is None:
            raise NotFoundError(f"Route {route.name} was deleted meanwhile; nothing was "
                                f"changed.")
        # The pools' row locks, which a registry edit lowering a context takes too: either
        # the edit sees these tiers, or these tiers see the edit.
        list(Pool.objects.select_for_update().filter(
            pk__in=PoolModel.objects.filter(model_id=locked.model_id).values("pool_id"))
            .order_by("pk"))
        if parsed and (refusal := _gateways_refusal(locked)):
            raise ValidationError({"tiers": [refusal]})
        views = tier_pools(locked, parsed)
        errors = {f"tiers[{v.index}]": [_unservable(locked, v)] for v in views
                  if not v.eligible and not v.refuses_all}
        if errors:
            raise ValidationError(errors)
        before = [tier_dict(t) for t in route_tiers(locked)]
        after = [tier_dict(t) for t in parsed]
        if before != after:
            ContextTier.objects.filter(route=locked).delete()
            for tier in parsed:
                tier.route = locked
            ContextTier.objects.bulk_create(parsed)
            audit_record(actor=actor, action="route.tiers", target=locked,
                         before={"tiers": before}, after={"tiers": after},
                         message=f"context tiers of {locked.name}: "
                                 f"{', '.join(t.label for t in parsed) or 'none'}")
    return tier_pools(locked, route_tiers(locked))


def context_lowering_refusal(pool: Pool, model_id: str | None, tokens: int) -> str | None:
    """Fleet's context guard: why the pool's registered context for `model_id` (every
    model it serves: None) may not become `tokens`, or None. Refused while the pool carries
    weight (or is the primary) on a route one of whose tiers it would no longer serve:
    drain first. The caller holds the pool's row lock."""
    routes = (Route.objects.filter(context_tiers__isnull=False).distinct()
              .select_related("primary_pool").order_by("name"))
    if model_id is not None:
        routes = routes.filter(model_id=model_id)
    routes = routes.filter(model_id__in=PoolModel.objects.filter(pool=pool)
                           .values("model_id"))
    route_list = list(routes)
    current = selectors.revisions_current(routes=route_list)
    found = []
    for route in route_list:
        revision = current.get(route.pk)
        share = (int(revision.weights.get(pool.name, 0))
                 if revision is not None and revision.pool_ids.get(pool.name) == pool.pk else 0)
        if not share and route.primary_pool_id != pool.pk:
            continue
        tiers = route_tiers(route)
        now = tier_pools(route, tiers)
        after = tier_pools(route, tiers, found=candidates(route, context={pool.pk: tokens}))
        for was, will in zip(now, after, strict=True):
            if pool.name in was.eligible_names and pool.name not in will.eligible_names:
                carries = (f"carries {share / 100:g} %" if share
                           else "is its primary")
                found.append(f"route {route.name} {carries}, and its tier "
                             f"{was.tier.label} needs {was.needed:,} tokens")
    if not found:
        return None
    return f"{'; '.join(found)}"
