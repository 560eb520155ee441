"""Writes: the metric-source registry (administrators), the query checks' and the rules
check's measurements (fleetctl's own job, recorded as plan evidence), and turning a plan's
attested dashboards check into the measured one."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record, audit_refused, snapshot
from fleetctl.core.destinations import METRICS, url_problem
from fleetctl.core.errors import ConflictError
from fleetctl.prometheus import evidence, generate, selectors
from fleetctl.prometheus.models import MetricSource
from fleetctl.prometheus.query import (
    FAIL,
    INSUFFICIENT,
    PASS,
    SPEC_FIELDS,
    Measurement,
    QuerySpec,
    _NoAnswer,
    measure,
    source_get,
    spec_problems,
)
from fleetctl.prometheus.telemetry import forget

if TYPE_CHECKING:
    from migrations_plan.models import GateCheck, Plan

log = logging.getLogger(__name__)
AUDITED = ["name", "kind", "base_url", "timeout_s", "telemetry_selector"]


# --- the registry ---------------------------------------------------------------------------

def _picture(source: MetricSource) -> dict[str, Any]:
    return {**snapshot(source, AUDITED), "bearer_token": "(set)" if source.bearer_token
            else "(none)"}


def _checked(actor: Actor, action: str, source: MetricSource) -> None:
    problems: dict[str, list[str]] = {}
    if source.kind not in MetricSource.Kind.values:
        problems["kind"] = [f"One of {', '.join(MetricSource.Kind.values)}."]
    selector_why = selector_problem(source.telemetry_selector, kind=source.kind)
    if selector_why:
        problems["telemetry_selector"] = [selector_why]
    why = url_problem(source.base_url, purpose=METRICS)
    if why:
        audit_refused(actor=actor, action=action, target="prometheus.metricsource",
                      message=f"URL refused: {why}")
        problems["base_url"] = [f"{why}."]
    try:
        source.full_clean(exclude=["created_by"], validate_unique=False)
    except ValidationError as exc:
        for name, messages in exc.message_dict.items():
            problems.setdefault(name, []).extend(messages)
    if problems:
        raise ValidationError(problems)


def selector_problem(selector: str, *, kind: str) -> str:
    """What is wrong with a telemetry selector ("" when nothing, or when none is set)."""
    selector = selector.strip()
    if not selector:
        return ""
    if kind != MetricSource.Kind.PROMETHEUS:
        return (f"Only a Prometheus can be a telemetry source (this one is {kind}): leave it "
                f"empty.")
    if "$pool" not in selector:
        return ("Name the pool with $pool, e.g. pool=\"$pool\": without it every pool would "
                "read the same series.")
    if "$route" in selector or "$model" in selector:
        return ("Only $pool: a telemetry source reads a pool's series, every route and "
                "model together.")
    if any(c in selector for c in "{}\n"):
        return ("Label matchers only, without braces, e.g. pool=\"$pool\",job=\"vllm\" "
                "(fleetctl puts them inside the metric's braces).")
    return ""


def source_create(*, actor: Actor, name: str, base_url: str, kind: str = "prometheus",
                  bearer_token: str = "", timeout_s: float = 5.0,
                  telemetry_selector: str = "") -> MetricSource:
    """Register a metric source (administrators: its URL is fleetctl's to reach). With a
    `telemetry_selector` it is also a telemetry source (fleetctl/prometheus/telemetry.py)."""
    actor.require(roles.ADMIN_MANAGE, action="metric-source.create",
                  target="prometheus.metricsource")
    source = MetricSource(name=name, kind=kind, base_url=base_url.strip(),
                          bearer_token=bearer_token, timeout_s=timeout_s,
                          telemetry_selector=telemetry_selector.strip(),
                          created_by=actor.label)
    _checked(actor, "metric-source.create", source)
    with transaction.atomic():
        if MetricSource.objects.filter(name=name).exists():
            raise ConflictError(f"A metric source named {name} exists.")
        source.save()
        audit_record(actor=actor, action="metric-source.create", target=source,
                     after=_picture(source))
    return source


def source_update(*, actor: Actor, source: MetricSource, **changes: Any) -> MetricSource:
    actor.require(roles.ADMIN_MANAGE, action="metric-source.update", target=source)
    unknown = sorted(set(changes) - {"kind", "base_url", "bearer_token", "timeout_s",
                                     "telemetry_selector"})
    if unknown:
        raise ValidationError({name: ["This field cannot be changed here."] for name in unknown})
    with transaction.atomic():
        locked = MetricSource.objects.select_for_update().get(pk=source.pk)
        before = _picture(locked)
        token_before = locked.bearer_token
        for name, value in changes.items():
            setattr(locked, name, value.strip() if name in ("base_url", "telemetry_selector")
                    else value)
        _checked(actor, "metric-source.update", locked)
        locked.save()
        after = _picture(locked)
        if locked.bearer_token != token_before:
            before["bearer_token"], after["bearer_token"] = "(hidden)", "(changed)"
        changed = sorted(k for k in after if before[k] != after[k])
        if {"telemetry_selector", "base_url"} & set(changed):
            # Other series (or none): the next read starts from where they stand.
            forget(locked.name)
        if changed:
            audit_record(actor=actor, action="metric-source.update", target=locked,
                         before={k: before[k] for k in changed},
                         after={k: after[k] for k in changed})
    return locked


def source_delete(*, actor: Actor, source: MetricSource) -> None:
    """Remove a source no open plan's gate check and no active ramp reads (refused, 409,
    naming them: each would turn insufficient, and a gate or a ramp stall, unexplained)."""
    actor.require(roles.ADMIN_MANAGE, action="metric-source.delete", target=source)
    with transaction.atomic():
        locked = MetricSource.objects.select_for_update().get(pk=source.pk)
        users = selectors.source_users(locked)
        if users:
            raise ConflictError(f"Metric source {locked.name} is in use: "
                                f"{'; '.join(u.text for u in users)}. Remove or change those "
                                f"checks (or end the ramps) first.")
        audit_record(actor=actor, action="metric-source.delete", target=locked,
                     before=_picture(locked))
        forget(locked.name)
        locked.delete()


def source_test(*, actor: Actor, source: MetricSource, query: str, field: str = "",
                success: str = "", failure: str = "", pool: str = "", route: str = "",
                model: str = "") -> Measurement:
    """A person's test query through the one query path (the checks' own `measure`): the
    values, judged when a condition is given. Writes nothing but the source's last outcome;
    only those who change the fleet may make fleetctl reach out on their behalf."""
    actor.require(roles.FLEET_MANAGE, action="metric-source.test", target=source)
    _, problems = spec_problems({"source": source.name, "query": query, "field": field,
                                 "success": success, "failure": failure})
    # A test may leave both conditions out: it shows the values, unjudged.
    problems = [p for p in problems if not p.startswith("success/failure:")]
    if problems:
        raise ValidationError(_by_field(problems))
    spec = QuerySpec(source=source.name, query=query.strip(), success=success.strip(),
                     failure=failure.strip(), field=field.strip())
    result = measure(source, spec, pool=pool.strip(), route=route.strip(),
                     model=model.strip())
    remember(source, result)
    return result


def _by_field(problems: list[str]) -> dict[str, list[str]]:
    """spec_problems' "field: message" lines, keyed by the field they name."""
    found: dict[str, list[str]] = {}
    for line in problems:
        name, _, message = line.partition(": ")
        found.setdefault(name if name in SPEC_FIELDS else "__all__", []).append(message or line)
    return found


def remember(source: MetricSource, result: Measurement) -> None:
    """The source's last outcome (one UPDATE; the newest measurement wins)."""
    MetricSource.objects.filter(pk=source.pk).update(
        last_status=result.status, last_reason=result.reason[:2000],
        last_at=timezone.now())


# --- measuring -------------------------------------------------------------------------------

def spec_of(params: dict[str, Any]) -> QuerySpec:
    """A gate check's parameters as a query spec ("none" left out)."""
    return QuerySpec(source=params["source"], query=params["query"],
                     success=evidence.optional(params.get("success", "")),
                     failure=evidence.optional(params.get("failure", "")),
                     field=evidence.optional(params.get("field", "")))


def query_measure(spec: QuerySpec, *, pool: str = "", route: str = "",
                  model: str = "") -> Measurement:
    """One measurement of a spec: a source that is not registered (any more), or a spec
    with no condition, is an insufficient measurement saying so."""
    source = MetricSource.objects.filter(name=spec.source).first()
    if source is None:
        return Measurement(INSUFFICIENT, f"{spec.label}: no metric source named "
                                         f"{spec.source!r} (it was removed?)", spec.source,
                           spec.query, at=timezone.now().timestamp())
    if not spec.success and not spec.failure:
        return Measurement(INSUFFICIENT, f"{spec.label}: neither a success nor a failure "
                                         f"condition: nothing to judge", spec.source,
                           spec.query, at=timezone.now().timestamp())
    result = measure(source, spec, pool=pool, route=route, model=model)
    remember(source, result)
    return result


def gate_checks_due(*, now: datetime) -> list[GateCheck]:
    """Live query and rules checks of the stage each open plan is at."""
    from migrations_plan.models import GateCheck, Plan

    checks = (GateCheck.objects.select_related("plan__candidate_pool")
              .filter(rule__in=[evidence.QUERY_RULE, evidence.ALERTS_RULE],
                      removed_at__isnull=True)
              .exclude(plan__state__in=[*Plan.CLOSED_STATES, Plan.State.PAUSED]))
    return [c for c in checks if c.stage == c.plan.stage]


def gate_queries_measure(*, now: datetime | None = None) -> int:
    """The producer (beat): measure each due check once and record the row. A query check is
    due `interval_s` after its newest row; the rules check every 60 s. Returns how many were
    measured. One check's trouble is logged and never stops the others."""
    from migrations_plan.evidence import RULES
    from migrations_plan.models import Evidence

    now = now or timezone.now()
    measured = 0
    for check in gate_checks_due(now=now):
        try:
            params = RULES[check.rule].clean_params(check.params)
        except ValidationError:
            continue  # the gate says "Invalid parameters" itself
        pool = check.plan.candidate_pool
        if check.rule == evidence.QUERY_RULE:
            digest = evidence.check_digest(params)
            interval = float(params["interval_s"])
            kind = evidence.QUERY_KIND
        else:
            digest, interval, kind = "", 60.0, evidence.ALERTS_KIND
        rows = Evidence.objects.filter(kind=kind, pool=pool,
                                       observed_at__gt=now - timedelta(seconds=interval))
        rows = rows.filter(data__check=digest) if digest else rows.filter(
            data__source=params["source"], data__group=generate.group_name(pool.name))
        if rows.exists():
            continue
        try:
            if check.rule == evidence.QUERY_RULE:
                query_check_record(check.plan, params)
            else:
                alerts_check_record(check.plan, params["source"])
            measured += 1
        except Exception:
            log.exception("measuring check %s of plan %s failed", check.pk, check.plan_id)
    return measured


def query_check_record(plan: Plan, params: dict[str, Any]) -> Measurement:
    from migrations_plan.services import evidence_record

    spec = spec_of(params)
    route = plan.routes.order_by("name").first()
    result = query_measure(spec, pool=plan.candidate_pool.name,
                           route=route.name if route else "",
                           model=route.model_id if route else "")
    evidence_record(
        actor=Actor.for_system("metric-query"), pool=plan.candidate_pool, kind=evidence.QUERY_KIND,
        verdict=result.status, summary=result.reason[:300],
        data={"check": evidence.check_digest(params), "source": spec.source,
              "query": result.query, "success": spec.success, "failure": spec.failure,
              "measurement": result.as_dict()},
        source=f"queried from {spec.source}", ttl_hours=24)
    return result


def alerts_loaded_in(source: MetricSource, pool: str) -> tuple[str, str, list[str], list[str]]:
    """Ask a Prometheus's rules API for the pool's generated group: (status, summary, loaded,
    missing). Insufficient when it does not answer."""
    group = generate.group_name(pool)
    expected = list(generate.ALERT_NAMES)
    if source.kind != MetricSource.Kind.PROMETHEUS:
        return (INSUFFICIENT, f"{source.name} is an {source.kind} source: only a Prometheus "
                              f"has a rules API", [], expected)
    try:
        body, _ = source_get(source, "/api/v1/rules", {"type": "alert"})
    except _NoAnswer as exc:
        return INSUFFICIENT, f"{source.name}'s rules API: {exc}", [], expected
    groups = ((body.get("data") or {}).get("groups") or []) if isinstance(body, dict) else []
    names = {str(r.get("name")) for g in groups if g.get("name") == group
             for r in g.get("rules") or [] if r.get("type", "alerting") == "alerting"}
    loaded = [n for n in expected if n in names]
    missing = [n for n in expected if n not in names]
    if missing:
        where = f"group {group} is not loaded" if not names else f"group {group} lacks them"
        return (FAIL, f"measured: {len(loaded)} of {len(expected)} rules loaded in "
                      f"{source.name}; missing: {', '.join(missing)} ({where})", loaded,
                missing)
    return (PASS, f"measured: {len(loaded)} rules loaded in {source.name} (group {group})",
            loaded, [])


def alerts_check_record(plan: Plan, source_name: str) -> str:
    from migrations_plan.services import evidence_record

    pool = plan.candidate_pool
    source = MetricSource.objects.filter(name=source_name).first()
    loaded: list[str]
    missing: list[str]
    if source is None:
        status, summary, loaded, missing = (INSUFFICIENT, f"no metric source named "
                                            f"{source_name!r}", [], list(generate.ALERT_NAMES))
    else:
        status, summary, loaded, missing = alerts_loaded_in(source, pool.name)
    evidence_record(
        actor=Actor.for_system("rules-check"), pool=pool, kind=evidence.ALERTS_KIND,
        verdict=status, summary=summary[:300],
        data={"source": source_name, "group": generate.group_name(pool.name),
              "expected": list(generate.ALERT_NAMES), "loaded": loaded, "missing": missing,
              "reason": summary},
        source=f"queried from {source_name}", ttl_hours=24)
    return status


def dashboards_measured(*, actor: Actor, plan: Plan, source: MetricSource) -> GateCheck:
    """Stage 2's attested "Dashboards and alerts exist" becomes measured: the attested check
    is removed (with the reason) and the rules check takes its key, reading `source`. Both
    edits are the plan's own (audited); approvals that saw the old gate are voided."""
    from migrations_plan import services as plans

    if source.kind != MetricSource.Kind.PROMETHEUS:
        raise ValidationError({"source": [f"{source.name} is not a Prometheus: only a "
                                          f"Prometheus has a rules API."]})
    check = plan.checks.filter(stage=2, key="dashboards", removed_at__isnull=True).first()
    if check is not None and check.rule == evidence.ALERTS_RULE:
        return check
    if check is not None:
        plans.check_remove(actor=actor, check=check,
                           reason=f"measured instead: {source.name}'s rules API is asked for "
                                  f"the generated alerts of {plan.candidate_pool.name}")
    added = plans.check_add(actor=actor, plan=plan, stage=2, key="dashboards",
                            title="Dashboards and alerts exist for the candidate (measured)",
                            rule=evidence.ALERTS_RULE, params={"source": source.name})
    alerts_check_record(plan, source.name)
    return added


# --- ramp guards --------------------------------------------------------------------------------

def ramp_metrics_measure(specs: list[dict[str, Any]], *, pool: str, route: str,
                         model: str) -> list[Measurement]:
    """Each extra guard metric of a ramp, measured now (a spec that no longer parses is an
    insufficient measurement, never skipped)."""
    results = []
    for raw in specs:
        spec, problems = spec_problems(raw)
        if spec is None:
            results.append(Measurement(INSUFFICIENT, "; ".join(problems),
                                       str(raw.get("source", "")) if isinstance(raw, dict)
                                       else "", "", at=timezone.now().timestamp()))
            continue
        results.append(query_measure(spec, pool=pool, route=route, model=model))
    return results


def ramp_metrics_problems(raw: Any) -> list[str]:
    """What is wrong with a ramp's `metric_checks` (a list of query specs, at most 10)."""
    if raw in (None, []):
        return []
    if not isinstance(raw, list):
        return ["a list of query checks"]
    if len(raw) > 10:
        return ["at most 10 query checks"]
    problems = []
    names = set(MetricSource.objects.values_list("name", flat=True))
    for index, item in enumerate(raw):
        _, found = spec_problems(item)
        problems += [f"[{index}] {p}" for p in found]
        named = item.get("source") if isinstance(item, dict) else None
        if isinstance(named, str) and named.strip() and named.strip() not in names:
            problems.append(f"[{index}] source: no metric source named {named.strip()!r} "
                            f"(GET /api/v1/metric-sources/)")
    return problems


__all__ = ["FAIL", "PASS", "alerts_check_record", "alerts_loaded_in", "dashboards_measured",
           "gate_queries_measure", "query_check_record", "query_measure",
           "ramp_metrics_measure", "ramp_metrics_problems", "remember", "source_create",
           "source_delete", "source_test", "source_update"]
