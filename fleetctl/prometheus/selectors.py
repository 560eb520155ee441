"""Reads: metric sources, the SLO a pool's generated alerts use, the generated files."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from django.db.models import Q, QuerySet
from django.urls import reverse

from fleetctl.core.errors import NotFoundError
from fleetctl.core.panels import provided
from fleetctl.prometheus import generate
from fleetctl.prometheus.models import MetricSource

if TYPE_CHECKING:
    from fleetctl.fleet.models import Pool
    from migrations_plan.models import Plan


def source_list() -> QuerySet[MetricSource]:
    return MetricSource.objects.order_by("name")


def source_by_name(name: str) -> MetricSource:
    source = MetricSource.objects.filter(name=name).first()
    if source is None:
        raise NotFoundError(f"No metric source named {name!r} (GET /api/v1/metric-sources/).")
    return source


@dataclass(frozen=True)
class SourceUser:
    """A gate check of an open plan, or an active ramp, that reads a metric source."""

    source: str
    text: str  # "plan p, stage 2 check dashboards" / "ramp 7 (pool on route)"
    url: str


def source_users_by_name() -> dict[str, list[SourceUser]]:
    """Who reads each source now: the live query and rules checks of open plans (a closed
    plan's are never measured again) and the metric checks of running or paused ramps."""
    from fleetctl.prometheus.evidence import ALERTS_RULE, QUERY_RULE
    from migrations_plan.models import GateCheck, Plan

    found: dict[str, list[SourceUser]] = {}
    checks = (GateCheck.objects.select_related("plan")
              .filter(rule__in=[QUERY_RULE, ALERTS_RULE], removed_at__isnull=True)
              .exclude(plan__state__in=Plan.CLOSED_STATES).order_by("plan__name", "stage",
                                                                     "position", "id"))
    for check in checks:
        name = (check.params or {}).get("source")
        if isinstance(name, str):
            found.setdefault(name, []).append(SourceUser(
                name, f"plan {check.plan.name}, stage {check.stage} check {check.key}",
                reverse("plans:detail", args=[check.plan.name])))
    # Ramps sit above this app: they tell who of them reads which source (ramps/apps.py
    # registers the provider "prometheus.source_readers": name -> [(text, url)]).
    readers: dict[str, list[tuple[str, str]]] = provided("prometheus.source_readers") or {}
    for name, entries in sorted(readers.items()):
        for text, url in entries:
            found.setdefault(name, []).append(SourceUser(name, text, url))
    return found


def source_users(source: MetricSource) -> list[SourceUser]:
    return source_users_by_name().get(source.name, [])


def _slo_of(plan: Plan | None) -> generate.Slo:
    if plan is None:
        d = generate.DEFAULT_SLO
        return generate.Slo(d["ttft_p95_ms"], d["tpot_p95_ms"], d["error_rate"],
                            "fleetctl's defaults (no open plan has this pool)")
    return generate.Slo(plan.slo_ttft_p95_ms, plan.slo_tpot_p95_ms, plan.slo_error_rate,
                        f"plan {plan.name}")


def pool_plan(pool: Pool) -> Plan | None:
    """The newest open plan that has the pool as its candidate or its primary."""
    from migrations_plan.models import Plan

    return (Plan.objects.filter(Q(candidate_pool=pool) | Q(primary_pool=pool))
            .exclude(state__in=Plan.CLOSED_STATES).order_by("-created_at", "-id").first())


def pool_rules_yaml(pool: Pool) -> str:
    slo = _slo_of(pool_plan(pool))
    group = generate.pool_group(pool=pool.name, accelerator=pool.accelerator,
                                runtime=pool.runtime, slo=slo)
    return generate.rules_yaml([group], about=f"pool {pool.name} ({slo.origin})")


def pool_dashboard(pool: Pool) -> dict[str, object]:
    return generate.dashboard(title=f"fleetctl · {pool.name} ({pool.accelerator})",
                              uid=f"fleetctl-pool-{pool.name}"[:40],
                              pools=[(pool.name, pool.accelerator, pool.runtime)],
                              slo=_slo_of(pool_plan(pool)))


def plan_rules_yaml(plan: Plan) -> str:
    """The candidate's and the primary's groups, both on the plan's SLO."""
    slo = _slo_of(plan)
    groups = [generate.pool_group(pool=p.name, accelerator=p.accelerator, runtime=p.runtime,
                                  slo=slo) for p in (plan.candidate_pool, plan.primary_pool)]
    return generate.rules_yaml(groups, about=f"plan {plan.name}")


def plan_dashboard(plan: Plan) -> dict[str, object]:
    pools = [(p.name, p.accelerator, p.runtime) for p in (plan.candidate_pool,
                                                          plan.primary_pool)]
    return generate.dashboard(title=f"fleetctl · plan {plan.name}",
                              uid=f"fleetctl-plan-{plan.name}"[:40], pools=pools,
                              slo=_slo_of(plan))
