from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, timedelta
from decimal import Decimal
from urllib.parse import urlsplit

from django.db.models import Count, Prefetch, Q, QuerySet
from django.utils import timezone

from fleetctl.fleet.interruption import InterruptionTax, effective_rate, effective_rates
from fleetctl.fleet.models import (
    CurrencyRate,
    HealthCheck,
    HealthTransition,
    Pool,
    PoolModel,
    Region,
    endpoint_key,
    money,
)


def region_list() -> QuerySet[Region]:
    return Region.objects.annotate(pool_count=Count("pools")).order_by("code")


def pool_list() -> QuerySet[Pool]:
    """Pools with everything a list shows, in a constant number of queries."""
    return Pool.objects.select_related("region").prefetch_related(
        Prefetch("models", queryset=PoolModel.objects.order_by("model_id"))
    )


def pool_ids_to_probe() -> QuerySet[Pool, int]:
    return Pool.objects.order_by("pk").values_list("pk", flat=True)


def pool_for_probe(*, pool_id: int) -> Pool | None:
    return Pool.objects.only("pk", "base_urls").filter(pk=pool_id).first()


def pool_configured_models(*, pool_id: int) -> list[str]:
    """The models a pool's probe expects /v1/models to list."""
    return sorted(set(PoolModel.objects.filter(pool_id=pool_id)
                      .values_list("model_id", flat=True)))


def pool_get(*, name: str) -> Pool | None:
    return pool_list().filter(name=name).first()


def pool_interruption(*, pool: Pool) -> InterruptionTax:
    """The pool's hourly rate and interruption tax, itemised (fleet/interruption.py)."""
    return effective_rate(pool)


def pools_with_interruption(pools: list[Pool]) -> list[Pool]:
    """Each pool with `tax` (its interruption tax) and `cost_incl_tax` (its benchmark cost
    with it): one drill read for the interruptible ones, none when no pool is."""
    taxes = effective_rates(pools)
    for pool in pools:
        tax = taxes[pool.name]
        pool.tax = tax  # type: ignore[attr-defined]
        pool.cost_incl_tax = tax.apply(pool.cost_per_1m_output_tokens)  # type: ignore[attr-defined]
    return pools


def pool_exists(*, name: str) -> bool:
    return Pool.objects.filter(name=name).exists()


def pool_model_list() -> QuerySet[PoolModel]:
    return PoolModel.objects.select_related("pool", "pool__region")


def health_check_list() -> QuerySet[HealthCheck]:
    return HealthCheck.objects.select_related("pool")


def health_transition_list() -> QuerySet[HealthTransition]:
    return HealthTransition.objects.select_related("pool")


def pool_health_history(*, pool: Pool, hours: int = 24, limit: int = 2000) -> list[HealthCheck]:
    since = timezone.now() - timedelta(hours=hours)
    rows = list(
        HealthCheck.objects.filter(pool=pool, checked_at__gte=since)
        .only("checked_at", "ok", "latency_ms", "status_code", "error")
        .order_by("-checked_at")[:limit]
    )
    rows.reverse()
    return rows


@dataclass
class FleetSummary:
    pools: int
    healthy: int
    unhealthy: int
    unknown: int
    regions: int
    jurisdictions: int


def fleet_summary() -> FleetSummary:
    counts = Pool.objects.aggregate(
        pools=Count("pk"),
        healthy=Count("pk", filter=Q(health_state=Pool.Health.HEALTHY)),
        unhealthy=Count("pk", filter=Q(health_state=Pool.Health.UNHEALTHY)),
        unknown=Count("pk", filter=Q(health_state=Pool.Health.UNKNOWN)),
    )
    regions = Region.objects.aggregate(
        regions=Count("pk"), jurisdictions=Count("jurisdiction", distinct=True)
    )
    return FleetSummary(**counts, **regions)


def pools_for_overview(pools: QuerySet[Pool]) -> QuerySet[Pool]:
    """The overview's order: vendor/runtime, then region, then name (pages keep groups whole
    as far as a page allows)."""
    return pools.order_by("runtime", "region__code", "name")


def pools_grouped(pools: Iterable[Pool]) -> list[tuple[str, list[tuple[Region, list[Pool]]]]]:
    """Overview layout: vendor/runtime → region → pools, from pools already in overview order."""
    tree: dict[str, dict[int, tuple[Region, list[Pool]]]] = defaultdict(dict)
    for pool in pools:
        regions = tree[pool.get_runtime_display()]
        regions.setdefault(pool.region_id, (pool.region, []))[1].append(pool)
    return [(vendor, list(regions.values())) for vendor, regions in tree.items()]


# --- dashboard reads (appended for the web views) --------------------------------------------

def pool_model_get(*, pool: Pool, entry_id: int) -> PoolModel | None:
    return PoolModel.objects.filter(pool=pool, pk=entry_id).first()


def pool_recent_transitions(*, pool: Pool, limit: int = 20) -> list[HealthTransition]:
    return list(HealthTransition.objects.filter(pool=pool).order_by("-at", "-id")[:limit])


def region_codes() -> list[str]:
    """Region codes for the overview filter's suggestions (one query, no rows loaded)."""
    return list(Region.objects.order_by("code").values_list("code", flat=True))


def model_ids_served() -> list[str]:
    """Every distinct model id some pool serves, for the overview filter's suggestions."""
    return list(
        PoolModel.objects.order_by("model_id").values_list("model_id", flat=True).distinct()
    )


def _port_of(url: str) -> int | None:
    parts = urlsplit(url.strip())
    try:
        return parts.port or (443 if parts.scheme.lower() == "https" else 80)
    except ValueError:
        return None


def _host_of(url: str) -> str:
    return (urlsplit(url.strip()).hostname or "").rstrip(".").lower()


def endpoint_servers(url: str) -> frozenset[tuple[str, int]]:
    """The servers a base URL reaches (core.destinations.same_server_keys: every address its
    host resolves to, all of this host's addresses as one). A name that does not resolve now
    stands for itself, so two pools with the same unresolvable name still share it."""
    from fleetctl.core.destinations import DestinationRefused, same_server_keys

    try:
        return same_server_keys(url)
    except DestinationRefused:
        return frozenset({(f"name:{_host_of(url)}", _port_of(url) or 0)})


def endpoints_registered_elsewhere(*, base_urls: Iterable[str], jurisdiction: str,
                                   exclude: Iterable[int] = ()) -> list[str]:
    """Base URLs among `base_urls` that reach a server a pool in another jurisdiction already
    has an endpoint on, as sentences: one server cannot sit in two jurisdictions, or a
    pinned route could reach it through a pool registered on the other side of the border.
    Compared by what the URLs connect to, not how they are spelled (`localhost`,
    `127.0.0.1` and this host's own addresses are one host; a name is each of its
    addresses; scheme and path do not matter)."""
    wanted = [(url, endpoint_servers(url)) for url in base_urls]
    ports = {port for _, servers in wanted for _, port in servers}
    # Only a name that does not resolve is a "name:" key, and it matches only the same name:
    # another pool's host is looked up only when one of ours resolved (a resolver can take
    # a while to say a name is unknown, and a registry holds hundreds of pools).
    by_address = any(not host.startswith("name:") for _, servers in wanted
                     for host, _ in servers)
    clashes = []
    for name, urls, where in (Pool.objects.exclude(pk__in=list(exclude))
                              .exclude(region__jurisdiction=jurisdiction)
                              .values_list("name", "base_urls", "region__jurisdiction")):
        for url in urls:
            port = _port_of(url)
            if port not in ports:
                continue  # another port is another server: no need to resolve its host
            servers = endpoint_servers(url) if by_address else frozenset(
                {(f"name:{_host_of(url)}", port)})
            for mine, my_servers in wanted:
                if my_servers & servers:
                    same = "" if endpoint_key(mine) == endpoint_key(url) else f" ({url})"
                    clashes.append(f"{mine} reaches the same server as pool {name}'s "
                                   f"endpoint{same}, in {where}")
    return sorted(set(clashes))


# --- currency rates --------------------------------------------------------------------------

def currency_rate_list() -> QuerySet[CurrencyRate]:
    return CurrencyRate.objects.all()


def currency_rate_get(*, rate_id: int) -> CurrencyRate | None:
    return CurrencyRate.objects.filter(pk=rate_id).first()


@dataclass(frozen=True)
class Conversion:
    """An amount in one currency, expressed in another through one dated rate row."""

    amount: Decimal
    from_currency: str
    to_currency: str
    rate: Decimal  # to_currency per one from_currency, as used
    row: CurrencyRate
    inverted: bool  # the row is the to→from rate; `rate` is its inverse

    @property
    def text(self) -> str:
        """"EUR converted at 1.08 USD/EUR as of 2026-11-30"."""
        via = (f" (the inverse of {self.row.label})" if self.inverted else "")
        shown = money(self.rate.quantize(Decimal("0.000001")))
        return (f"{self.from_currency} converted at {shown} "
                f"{self.to_currency}/{self.from_currency}{via} as of {self.row.as_of:%Y-%m-%d}")

    def as_json(self) -> dict[str, object]:
        return {"from": self.from_currency, "to": self.to_currency, "rate": str(self.rate),
                "as_of": self.row.as_of.isoformat(), "rate_id": self.row.pk,
                "source": self.row.source, "inverted": self.inverted}


class NoRate(LookupError):
    """No usable rate: the message says which and what to do."""


def rate_on(*, from_currency: str, to_currency: str, on: date) -> tuple[CurrencyRate, bool] | None:
    """The latest rate between the two currencies dated on or before `on`: (row, inverted).
    A to→from row counts too (inverted); on the same day the direct row wins."""
    rows = (CurrencyRate.objects.filter(as_of__lte=on)
            .filter(Q(from_currency=from_currency, to_currency=to_currency)
                    | Q(from_currency=to_currency, to_currency=from_currency))
            .order_by("-as_of", "-id"))
    found = list(rows[:2])
    if not found:
        return None
    best = found[0]
    if (len(found) == 2 and found[1].as_of == best.as_of
            and found[1].from_currency == from_currency):
        best = found[1]
    return best, best.from_currency != from_currency


def convert(*, amount: Decimal | str, from_currency: str, to_currency: str, on: date,
            max_age_days: float) -> Conversion:
    """`amount` in `to_currency`, at the latest rate on or before `on`; raises NoRate when
    there is none, or when the latest is more than `max_age_days` older than `on`."""
    found = rate_on(from_currency=from_currency, to_currency=to_currency, on=on)
    pair = f"{from_currency}→{to_currency}"
    if found is None:
        raise NoRate(f"no {pair} rate dated on or before {on:%Y-%m-%d}: add one "
                     f"(Fleet → Currency rates) to compare the two")
    row, inverted = found
    age = (on - row.as_of).days
    if age > max_age_days:
        raise NoRate(f"the latest {pair} rate ({row.label}) is as of {row.as_of:%Y-%m-%d}, "
                     f"{age} days before the measurement (limit {max_age_days:g}): add a newer "
                     f"one")
    rate = (Decimal(1) / row.rate) if inverted else row.rate
    return Conversion(amount=Decimal(str(amount)) * rate, from_currency=from_currency,
                      to_currency=to_currency, rate=rate, row=row, inverted=inverted)
