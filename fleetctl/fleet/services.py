from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from functools import partial
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.crud import audited_create, audited_delete, audited_update, editable_fields
from fleetctl.audit.services import audit_record, refusals_audited
from fleetctl.core.destinations import DestinationRefused
from fleetctl.core.errors import ConflictError, NotFoundError
from fleetctl.fleet.hooks import (
    _change_hooks_run,
    _health_hooks_run,
    _rate_hooks_run,
    _report_hooks_run,
    tax_hooks_run,
)
from fleetctl.fleet.models import (
    CurrencyRate,
    HealthCheck,
    HealthTransition,
    Pool,
    PoolModel,
    Region,
    money,
)

log = logging.getLogger(__name__)

REGION_FIELDS = ["code", "name", "jurisdiction"]
POOL_FIELDS = editable_fields(Pool)
POOL_MODEL_FIELDS = ["model_id", "revision", "quantisation", "weight_format", "max_context_tokens"]


# --- regions ---------------------------------------------------------------------------------

def region_create(*, actor: Actor, code: str, name: str, jurisdiction: str) -> Region:
    region = Region(code=code, name=name, jurisdiction=jurisdiction)
    return audited_create(
        actor=actor, permission=roles.FLEET_MANAGE, action="region.create", instance=region
    )


def region_update(*, actor: Actor, region: Region, **changes: Any) -> Region:
    """A region may change its jurisdiction only when no route pinned elsewhere relies on one
    of its pools (409 naming them): the registry never moves pinned traffic across a border
    behind the operator's back; they drain first, then move the region."""
    actor.require(roles.FLEET_MANAGE, action="region.update", target=region)
    with refusals_audited(actor=actor, action="region.update", target=region), \
            transaction.atomic():
        locked = _locked_as_addressed(region, Region.objects.select_for_update(),
                                      what="Region", key="code")
        moved_to = changes.get("jurisdiction", locked.jurisdiction)
        if moved_to != locked.jurisdiction:
            pools = list(locked.pools.all())
            _refuse_border_crossing(f"Region {locked.code}", pools, moved_to)
            _refuse_mirror_targets(f"Region {locked.code} cannot move to {moved_to}", pools,
                                   outside=moved_to)
            for pool in pools:
                _refuse_shared_endpoints(pool.base_urls, moved_to,
                                         exclude=[p.pk for p in pools])
        updated = audited_update(
            actor=actor, permission=roles.FLEET_MANAGE, action="region.update",
            instance=locked, changes=changes, allowed=REGION_FIELDS,
        )
        if moved_to != locked.jurisdiction:
            _gateways_follow()
        return updated


def region_delete(*, actor: Actor, region: Region) -> None:
    audited_delete(actor=actor, permission=roles.FLEET_MANAGE, action="region.delete",
                   instance=region)


# --- pools -----------------------------------------------------------------------------------

def pool_create(*, actor: Actor, **fields: Any) -> Pool:
    unknown = set(fields) - set(POOL_FIELDS)
    if unknown:
        raise ValidationError({name: ["Unknown or read-only field."] for name in sorted(unknown)})
    pool = Pool(**fields)
    actor.require(roles.FLEET_MANAGE, action="pool.create", target="fleet.pool")
    with transaction.atomic():
        region = fields.get("region")
        if isinstance(region, Region) and isinstance(fields.get("base_urls"), list):
            _refuse_shared_endpoints(fields["base_urls"], region.jurisdiction)
        _refuse_unreachable_endpoints(fields.get("base_urls"))
        _refuse_unroutable(fields.get("name", ""), fields.get("base_urls"))
        created = audited_create(
            actor=actor, permission=roles.FLEET_MANAGE, action="pool.create", instance=pool
        )
        _gateways_follow()
        return created


def pool_update(*, actor: Actor, pool: Pool, **changes: Any) -> Pool:
    """Registry edits that would change where traffic goes are refused with 409 naming the
    routes (drain first): moving a pool out of a pinned route's jurisdiction, renaming a pool
    that routes send weight to (revisions name it), and giving it an endpoint that a pool in
    another jurisdiction already has."""
    actor.require(roles.FLEET_MANAGE, action="pool.update", target=pool)
    with refusals_audited(actor=actor, action="pool.update", target=pool), \
            transaction.atomic():
        # The same locks a split change takes (traffic services): the two serialise.
        locked = _locked_as_addressed(pool, Pool.objects.select_related("region")
                                      .select_for_update(of=("self", "region")))
        region = changes.get("region", locked.region)
        if isinstance(region, Region) and region.jurisdiction != locked.region.jurisdiction:
            _refuse_border_crossing(f"Pool {locked.name}", [locked], region.jurisdiction)
            _refuse_mirror_targets(f"Pool {locked.name} cannot move to "
                                   f"{region.jurisdiction}", [locked],
                                   outside=region.jurisdiction)
        if changes.get("name", locked.name) != locked.name:
            _refuse_while_relied_on(locked, "renamed")
            _refuse_mirror_targets(f"Pool {locked.name} cannot be renamed", [locked])
        urls = changes.get("base_urls", locked.base_urls)
        if isinstance(region, Region) and isinstance(urls, list):
            _refuse_shared_endpoints(urls, region.jurisdiction, exclude=[locked.pk])
        if "base_urls" in changes:
            _refuse_unreachable_endpoints(urls, pool=locked)
        if {"name", "base_urls"} & set(changes):
            _refuse_unroutable(changes.get("name", locked.name), urls)
        _refuse_context_lowering(locked, None, locked.max_context_tokens,
                                 changes.get("max_context_tokens"))
        before = _registered_pool(locked)
        tax_before = _tax_model(locked)
        updated = audited_update(
            actor=actor, permission=roles.FLEET_MANAGE, action="pool.update", instance=locked,
            changes=changes, allowed=POOL_FIELDS,
        )
        if {"name", "region", "base_urls"} & set(changes):
            _gateways_follow()
        _registered_change(updated.pk, before, _registered_pool(updated))
        if (tax_now := _tax_model(updated)) != tax_before:
            what = (f"pool {updated.name}'s interruption model changed by {actor.label} "
                    f"({tax_before} → {tax_now})")
            transaction.on_commit(partial(tax_hooks_run, updated.pk, what))
        return updated


def _tax_model(pool: Pool) -> str:
    """What the pool's interruption tax is priced with besides its drills, in words."""
    if not pool.interruptible:
        return "not interruptible"
    return (f"{money(pool.reclaims_per_month)} reclaims a month, standby "
            f"{money(pool.standby_pct)} %")


def pool_delete(*, actor: Actor, pool: Pool) -> None:
    actor.require(roles.FLEET_MANAGE, action="pool.delete", target=pool)
    with refusals_audited(actor=actor, action="pool.delete", target=pool), \
            transaction.atomic():
        locked = _locked_as_addressed(pool, Pool.objects.select_for_update())
        _refuse_while_relied_on(locked, "deleted")
        _refuse_mirror_targets(f"Pool {locked.name} cannot be deleted", [locked])
        audited_delete(actor=actor, permission=roles.FLEET_MANAGE, action="pool.delete",
                       instance=locked)
        _gateways_follow()


def _locked_as_addressed(row: Any, rows: Any, *, what: str = "Pool", key: str = "name"
                         ) -> Any:
    """The row, locked, still the one the caller addressed. The API and the pages find a
    pool by name (a region by code) and then wait here for the lock; meanwhile another
    request may have deleted it (404) or renamed it (409: the change was meant for the row as
    it was named, and its old URL no longer names anything). Nothing is changed either way."""
    named = getattr(row, key)
    locked = rows.filter(pk=row.pk).first()
    if locked is None:
        raise NotFoundError(f"{what} {named} was deleted while this request waited for it; "
                            f"nothing was changed.")
    if getattr(locked, key) != named:
        now = getattr(locked, key)
        raise ConflictError(
            f"{what} {named} was renamed to {now} while this request waited for it; "
            f"nothing was changed. Read {what.lower()} {now} and send the change again if it "
            f"still applies.", extra={f"current_{key}": now})
    return locked


def _gateways_follow() -> None:
    """What gateways hold follows the registry: a pool's endpoints, and which pools may carry
    a route (at weight 0, ready for a ramp), change without a new revision. Pushed after the
    commit, like a revision."""
    from fleetctl.traffic.services import gateways_refresh

    gateways_refresh(reason="registry")


def _refuse_border_crossing(what: str, pools: list[Pool], jurisdiction: str) -> None:
    from fleetctl.traffic.selectors import routes_relying_on

    crossing = routes_relying_on(pools=pools, outside=jurisdiction)
    if crossing:
        raise ConflictError(
            f"{what} cannot move to {jurisdiction}: {'; '.join(crossing)}. Residency would "
            f"no longer hold, so nothing was changed. Drain the pool(s) off the routes that "
            f"send them traffic first; a pinned route's primary stays in its jurisdiction.")


def _refuse_while_relied_on(pool: Pool, what: str) -> None:
    from fleetctl.traffic.selectors import routes_relying_on

    relied_on = routes_relying_on(pools=[pool])
    if relied_on:
        raise ConflictError(
            f"Pool {pool.name} cannot be {what} while routes rely on it: "
            f"{'; '.join(relied_on)}. Drain it first; nothing was changed.")


def _refuse_mirror_targets(what: str, pools: list[Pool], *, outside: str | None = None,
                           model_id: str | None = None) -> None:
    """409 when a shadow run mirrors a route to one of `pools` and the edit would leave that
    pool outside the route's pin (`outside`: the jurisdiction the pools move to), not
    serving its model (`model_id` removed), or gone or renamed (neither given). Gateways
    would stop mirroring anyway (traffic selectors fail closed); refusing says why."""
    from fleetctl.traffic.selectors import routes_mirroring_to

    found = routes_mirroring_to(pools=pools, outside=outside, model_id=model_id)
    if found:
        raise ConflictError(f"{what}: {'; '.join(found)}. Nothing was changed.")


def _refuse_unroutable(name: str, base_urls: Any) -> None:
    """400 when a registered gateway could not route to the pool (e.g. a path prefix)."""
    from fleetctl.traffic.renderable import pool_routable_check

    pool_routable_check(name=name, base_urls=base_urls)


def _refuse_unreachable_endpoints(base_urls: Any, *, pool: Pool | None = None) -> None:
    """400 for an endpoint no pool may have (core.destinations: this host's loopback or
    own services, metadata, link-local... unless allow-listed for pools). A name that does
    not resolve now is taken (DNS may come later) -- except for a pool a pinned route relies
    on (409, drain first): its residency could not be checked, and a gateway that cannot
    resolve it would answer the pinned route's callers with errors."""
    from fleetctl.core.destinations import POOLS, DestinationUnresolved, destination_check
    from fleetctl.traffic.selectors import routes_relying_on

    if not isinstance(base_urls, list):
        return
    for url in base_urls:
        if not isinstance(url, str):
            continue
        try:
            destination_check(url, purpose=POOLS)
        except DestinationUnresolved as exc:
            pinned = [] if pool is None else routes_relying_on(pools=[pool], pinned=True)
            if pool is not None and pinned:
                raise ConflictError(
                    f"Pool {pool.name}: {url} cannot be checked ({exc}), and "
                    f"pinned routes rely on the pool: {'; '.join(pinned)}. Residency is "
                    f"checked by address, so nothing was changed. Drain the pool off those "
                    f"routes first, or give an endpoint that resolves.") from exc
        except DestinationRefused as exc:
            raise ValidationError({"base_urls": [f"{url}: {exc}."]}) from exc


def _refuse_shared_endpoints(base_urls: list[str], jurisdiction: str, *,
                             exclude: list[int] | None = None) -> None:
    from fleetctl.fleet.selectors import endpoints_registered_elsewhere

    clashes = endpoints_registered_elsewhere(base_urls=[u for u in base_urls
                                                        if isinstance(u, str)],
                                             jurisdiction=jurisdiction, exclude=exclude or [])
    if clashes:
        raise ValidationError({"base_urls": [
            f"{'; '.join(clashes)}. One server cannot sit in two jurisdictions."]})


def pool_model_create(*, actor: Actor, pool: Pool, **fields: Any) -> PoolModel:
    entry = PoolModel(pool=pool, **fields)
    with transaction.atomic():
        created = audited_create(actor=actor, permission=roles.FLEET_MANAGE,
                                 action="pool_model.create", instance=entry)
        _gateways_follow()
    return created


def pool_model_update(*, actor: Actor, entry: PoolModel, **changes: Any) -> PoolModel:
    # A full update (PUT) repeats the pool; only moving the entry to another pool is refused.
    if "pool" in changes and changes["pool"] == entry.pool:
        del changes["pool"]
    actor.require(roles.FLEET_MANAGE, action="pool_model.update", target=entry)
    with refusals_audited(actor=actor, action="pool_model.update", target=entry), \
            transaction.atomic():
        if changes.get("model_id", entry.model_id) != entry.model_id:
            _refuse_model_removal(entry)
        if isinstance(changes.get("max_context_tokens"), int):
            locked = Pool.objects.select_for_update().filter(pk=entry.pool_id).first()
            if locked is not None:
                _refuse_context_lowering(locked, entry.model_id, entry.max_context_tokens,
                                         changes["max_context_tokens"])
        before = _registered_model(entry)
        updated = audited_update(actor=actor, permission=roles.FLEET_MANAGE,
                                 action="pool_model.update", instance=entry, changes=changes,
                                 allowed=POOL_MODEL_FIELDS)
        if "model_id" in changes:
            _gateways_follow()
        _registered_change(updated.pool_id, before, _registered_model(updated))
    return updated


def pool_model_delete(*, actor: Actor, entry: PoolModel) -> None:
    """Refused (409, naming the routes) while a route of the model relies on the pool, as
    deleting the pool is: drain first."""
    actor.require(roles.FLEET_MANAGE, action="pool_model.delete", target=entry)
    with refusals_audited(actor=actor, action="pool_model.delete", target=entry), \
            transaction.atomic():
        _refuse_model_removal(entry)
        audited_delete(actor=actor, permission=roles.FLEET_MANAGE, action="pool_model.delete",
                       instance=entry)
        _gateways_follow()


# Asked (pool, model id or None for every model it serves, tokens) before a registry edit
# lowers the context a pool is registered for; a guard answers why not (e.g. a route's
# context tier needs more, and the pool carries weight on it), or None. Upper layers register
# here (traffic's context tiers) so that fleet needs no knowledge of routes.
ContextGuard = Callable[[Pool, "str | None", int], "str | None"]
CONTEXT_GUARDS: list[ContextGuard] = []


def register_context_guard(guard: ContextGuard) -> ContextGuard:
    if guard not in CONTEXT_GUARDS:
        CONTEXT_GUARDS.append(guard)
    return guard


def _refuse_context_lowering(pool: Pool, model_id: str | None, was: int, now: Any) -> None:
    """409 (drain first) when lowering the registered context from `was` to `now` would
    leave the pool below a tier whose traffic it carries. The caller holds the pool's row
    lock, which setting a route's tiers takes too."""
    if not isinstance(now, int) or isinstance(now, bool) or now >= was:
        return
    for guard in CONTEXT_GUARDS:
        reason = guard(pool, model_id, now)
        if reason:
            what = f"its {model_id} context" if model_id else "its max context"
            raise ConflictError(
                f"Pool {pool.name} cannot lower {what} to {now:,} tokens: {reason}. It "
                f"would no longer serve that tier while carrying its traffic; drain it off "
                f"the route first. Nothing was changed.")


def _refuse_model_removal(entry: PoolModel) -> None:
    """Under the pool's row lock (revision writers and route_mirror_set take it too), the
    rules of pool deletion for one model: no route of the model may give the pool weight
    or have it as its primary, and no shadow run may mirror the model to it."""
    from fleetctl.traffic.selectors import routes_serving_model_from

    pool = Pool.objects.select_for_update().filter(pk=entry.pool_id).first()
    if pool is None:
        raise NotFoundError(f"The pool that served {entry.model_id} was deleted meanwhile; "
                            f"nothing was changed.")
    relied_on = routes_serving_model_from(pool=pool, model_id=entry.model_id)
    if relied_on:
        raise ConflictError(
            f"Pool {pool.name} cannot stop serving {entry.model_id} while routes rely on it: "
            f"{'; '.join(relied_on)}. Drain it off those routes first; nothing was changed.")
    _refuse_mirror_targets(f"Pool {pool.name} cannot stop serving {entry.model_id}", [pool],
                           model_id=entry.model_id)


def pool_set_cost(*, actor: Actor, pool: Pool, cost_per_1m: Any, measured_at: Any,
                  hourly_rate: Any = None, currency: str = "", source: str = "") -> Pool:
    """Only the benchmarks service calls this: cost per 1M output tokens is derived, not typed.
    `hourly_rate` and `currency` are what it was computed with (default: the pool's now); a
    later change of either marks the cost stale (`Pool.cost_stale_reason`)."""
    with transaction.atomic():
        locked = Pool.objects.select_for_update().get(pk=pool.pk)
        before = {"cost_per_1m_output_tokens": locked.cost_per_1m_output_tokens}
        locked.cost_per_1m_output_tokens = cost_per_1m
        locked.cost_measured_at = measured_at
        locked.cost_hourly_rate = (hourly_rate if hourly_rate is not None
                                   else locked.node_hourly_rate)
        locked.cost_currency = currency or locked.currency
        locked.cost_source = source[:100]
        locked.save(update_fields=["cost_per_1m_output_tokens", "cost_measured_at",
                                   "cost_hourly_rate", "cost_currency", "cost_source",
                                   "updated_at"])
        audit_record(actor=actor, action="pool.cost_derived", target=locked, before=before,
                     after={"cost_per_1m_output_tokens": cost_per_1m,
                            "hourly_rate": str(locked.cost_hourly_rate),
                            "currency": locked.cost_currency, "source": locked.cost_source})
    return locked


# --- currency rates --------------------------------------------------------------------------

RATE_FIELDS = ["from_currency", "to_currency", "rate", "as_of", "source"]


def _other_rate_that_day(rate: CurrencyRate, from_currency: str, to_currency: str
                         ) -> CurrencyRate | None:
    """Another stored rate from `from_currency` to `to_currency` as of `rate`'s day."""
    return (CurrencyRate.objects.filter(from_currency=from_currency, to_currency=to_currency,
                                        as_of=rate.as_of)
            .exclude(pk=rate.pk).first())


def _refuse_inverse_same_day(rate: CurrencyRate) -> None:
    """EUR→USD and USD→EUR on one day would be two answers to one question."""
    inverse = _other_rate_that_day(rate, rate.to_currency, rate.from_currency)
    if inverse is not None:
        raise ValidationError({"from_currency": [
            f"There is already a {inverse.label} rate as of {inverse.as_of:%Y-%m-%d}; the "
            f"{rate.from_currency}→{rate.to_currency} rate is its inverse. Change that one "
            f"instead."]})
    same = _other_rate_that_day(rate, rate.from_currency, rate.to_currency)
    if same is not None:
        raise ValidationError({"as_of": [
            f"There is already a {same.label} rate as of {same.as_of:%Y-%m-%d}; change it "
            f"instead of adding a second one."]})


def currency_rate_create(*, actor: Actor, **fields: Any) -> CurrencyRate:
    """A dated exchange rate (platform leads and admins). Costs of pools in two currencies
    are compared only through these."""
    unknown = set(fields) - set(RATE_FIELDS)
    if unknown:
        raise ValidationError({name: ["Unknown or read-only field."] for name in sorted(unknown)})
    rate = CurrencyRate(created_by=actor.label, **fields)
    actor.require(roles.FLEET_MANAGE, action="currency_rate.create", target="fleet.currencyrate")
    with transaction.atomic():
        _refuse_inverse_same_day(rate)
        made = audited_create(actor=actor, permission=roles.FLEET_MANAGE,
                              action="currency_rate.create", instance=rate)
        _rates_changed(f"{made} added by {actor.label}")
        return made


def currency_rate_update(*, actor: Actor, currency_rate: CurrencyRate,
                         **changes: Any) -> CurrencyRate:
    actor.require(roles.FLEET_MANAGE, action="currency_rate.update", target=currency_rate)
    with transaction.atomic():
        preview = CurrencyRate(pk=currency_rate.pk, **{
            name: changes.get(name, getattr(currency_rate, name)) for name in RATE_FIELDS})
        _refuse_inverse_same_day(preview)
        saved = audited_update(actor=actor, permission=roles.FLEET_MANAGE,
                               action="currency_rate.update", instance=currency_rate,
                               changes=changes, allowed=RATE_FIELDS)
        _rates_changed(f"{saved} changed by {actor.label}")
        return saved


def currency_rate_delete(*, actor: Actor, currency_rate: CurrencyRate) -> None:
    what = f"{currency_rate} deleted by {actor.label}"
    with transaction.atomic():
        audited_delete(actor=actor, permission=roles.FLEET_MANAGE,
                       action="currency_rate.delete", instance=currency_rate)
        _rates_changed(what)


def _rates_changed(what: str) -> None:
    """After the commit, what converts with the rates judges again (fleet.hooks.RATE_HOOKS)."""
    transaction.on_commit(partial(_rate_hooks_run, what))


# --- health ----------------------------------------------------------------------------------

def reported_changes(before: dict[str, Any], now: dict[str, Any]) -> tuple[dict[str, Any],
                                                                           list[str]]:
    """What the pool reports after a probe that reported `now` (fields it did not report
    keep their last value: "not reported" is never a change), and the changes, one
    sentence each. A first report of a field is recorded, not a change."""
    lengths: dict[str, int] = dict(before.get("max_model_len") or {})
    merged: dict[str, Any] = {"server_version": before.get("server_version"),
                              "max_model_len": lengths}
    changes = []
    version = now.get("server_version")
    if version:
        if merged["server_version"] and merged["server_version"] != version:
            changes.append(f"server version {merged['server_version']} → {version}")
        merged["server_version"] = version
    for model, length in sorted((now.get("max_model_len") or {}).items()):
        was = lengths.get(model)
        if was is not None and was != length:
            changes.append(f"{model} max_model_len {was} → {length}")
        lengths[model] = length
    revisions: dict[str, str] = dict(before.get("model_revision") or {})
    merged["model_revision"] = revisions
    for model, revision in sorted((now.get("model_revision") or {}).items()):
        served = revisions.get(model)
        if served and served != revision:
            changes.append(f"{model} weights revision {served} → {revision}")
        revisions[model] = revision
    return merged, changes


def pool_health_record(
    *, pool_id: int, ok: bool, status_code: int | None, latency_ms: float | None,
    error: str = "", models_seen: list[str] | None = None,
    reported: dict[str, Any] | None = None,
) -> HealthCheck | None:
    """Store one probe result and flip the pool's state after K failures or successes.

    Runs under a row lock so two probes of one pool (a slow one and the next) count in order.
    Returns None when the pool was deleted meanwhile.
    """
    failures_needed = settings.HEALTH_FAILURES_TO_UNHEALTHY
    successes_needed = settings.HEALTH_SUCCESSES_TO_HEALTHY
    now = timezone.now()
    with transaction.atomic():
        pool = Pool.objects.select_for_update().filter(pk=pool_id).first()
        if pool is None:
            return None
        check = HealthCheck.objects.create(
            pool=pool, checked_at=now, ok=ok, status_code=status_code, latency_ms=latency_ms,
            error=error[:2000], models_seen=models_seen or [], reported=reported or {},
        )
        changes = _note_reported(pool, reported, now) if ok and reported else []
        if ok:
            pool.consecutive_successes += 1
            pool.consecutive_failures = 0
        else:
            pool.consecutive_failures += 1
            pool.consecutive_successes = 0
        target = pool.health_state
        if ok and pool.health_state != Pool.Health.HEALTHY and (
            pool.consecutive_successes >= successes_needed
            or pool.health_state == Pool.Health.UNKNOWN
        ):
            target = Pool.Health.HEALTHY
        elif not ok and pool.health_state != Pool.Health.UNHEALTHY and (
            pool.consecutive_failures >= failures_needed
        ):
            target = Pool.Health.UNHEALTHY
        pool.last_probe_at = now
        pool.last_probe_latency_ms = latency_ms
        pool.last_probe_error = "" if ok else error[:2000]
        update = ["consecutive_successes", "consecutive_failures", "last_probe_at",
                  "last_probe_latency_ms", "last_probe_error", "reported", "reported_at"]
        if target != pool.health_state:
            transition = _health_flip(pool=pool, to_state=target, check=check, now=now)
            update += ["health_state", "health_changed_at"]
            transaction.on_commit(partial(_health_hooks_run, pool.pk, transition.pk))
        pool.save(update_fields=update)
        if changes:
            transaction.on_commit(partial(_report_hooks_run, pool.pk, changes))
    return check


def _note_reported(pool: Pool, reported: dict[str, Any], now: datetime) -> list[str]:
    """Fold a probe's report into the pool (its `reported` and `reported_at`, saved by the
    caller) and audit a change."""
    pool.reported, changes = reported_changes(pool.reported or {}, reported)
    if changes or pool.reported_at is None:
        pool.reported_at = now
    if changes:
        audit_record(actor=Actor.for_system("health-probe"), action="pool.reported_change",
                     target=pool, message=f"{pool.name} reports a change nobody registered: "
                                          f"{'; '.join(changes)}",
                     after={"reported": pool.reported, "changes": changes})
    return changes


def _registered_pool(pool: Pool) -> dict[str, str]:
    return {"runtime version": pool.runtime_version,
            "driver label": str((pool.labels or {}).get("driver", ""))}


def _registered_model(entry: PoolModel) -> dict[str, str]:
    return {f"{entry.model_id} {label}": str(getattr(entry, field) or "")
            for field, label in (("revision", "revision"), ("quantisation", "quantisation"),
                                 ("weight_format", "weight format"))}


def _registered_change(pool_id: int, before: dict[str, str], after: dict[str, str]) -> None:
    """After commit, the change hooks with what the edit changed of the pool's fingerprint,
    one sentence each ("registered runtime version rocm-6.4 → rocm-7.0"); none: no call."""
    changes = [f"registered {label} {before.get(label) or '(none)'} → {value or '(none)'}"
               for label, value in after.items() if before.get(label, value) != value]
    if changes:
        transaction.on_commit(partial(_change_hooks_run, pool_id, changes))


def _health_flip(*, pool: Pool, to_state: str, check: HealthCheck,
                 now: Any) -> HealthTransition:
    if to_state == Pool.Health.HEALTHY:
        reason = f"{pool.consecutive_successes} consecutive successful probe(s)"
    else:
        reason = f"{pool.consecutive_failures} consecutive failed probes; last: {check.error}"
    transition = HealthTransition.objects.create(
        pool=pool, at=now, from_state=pool.health_state, to_state=to_state, reason=reason,
        health_check=check,
    )
    audit_record(
        actor=Actor.for_system("health-probe"), action="pool.health_changed", target=pool,
        before={"health_state": pool.health_state}, after={"health_state": to_state},
        message=reason,
    )
    pool.health_state = to_state
    pool.health_changed_at = now
    return transition


def health_history_prune(*, older_than_days: int | None = None) -> int:
    days = older_than_days if older_than_days is not None else settings.HEALTH_HISTORY_DAYS
    cutoff = timezone.now() - timedelta(days=days)
    deleted, _ = HealthCheck.objects.filter(checked_at__lt=cutoff).delete()
    return deleted
