"""Writes for the conformance probe: start a run, execute it, cancel it, fail the ones whose
worker stopped, and record what a finished run found as `conformance` evidence.

A run probes every endpoint (base URL) of the pool under test, so one drifting replica is
caught, and one endpoint of the reference pool (the plan's primary, or one named), side by
side. It talks to each endpoint directly, never through a route. Every case's result is a
`ConformanceCase` row written as soon as it is judged; the run beats a heartbeat after each.
A worker that dies leaves the rows it wrote: a redelivered task resumes the run from them
(skipping what is stored) and the reaper (beat, every minute) fails a run whose heartbeat
stopped, so no run stays "running".

Verdict: fail when a required case fails (or could not be judged) on the pool under test;
warn when only optional ones do; pass otherwise.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.conformance import cases as suite
from fleetctl.conformance.evidence import KIND
from fleetctl.conformance.models import ConformanceCase, ConformanceRun
from fleetctl.core.errors import ConflictError
from fleetctl.fleet.models import Pool, PoolModel

if TYPE_CHECKING:
    from migrations_plan.models import Plan

log = logging.getLogger("fleetctl.conformance")
HEARTBEAT_STALE_S = 300
QUEUED_STALE_S = 900
PRODUCER = "conformance-probe"
# Worst first: how one case's rows over several endpoints add up.
SEVERITY = {suite.ERROR: 3, suite.FAIL: 2, suite.PASS: 1, suite.SKIP: 0}


def _models_served(pool: Pool) -> list[str]:
    return sorted(PoolModel.objects.filter(pool=pool).values_list("model_id", flat=True))


def run_create(*, actor: Actor, pool: Pool, plan: Plan | None = None,
               primary: Pool | None = None, model_id: str = "",
               include_saturation: bool = False,
               required_keys: Iterable[str] | None = None) -> ConformanceRun:
    """Queue a probe of `pool`. With a plan, the pool must be its candidate and the reference
    is its primary; the model defaults to the one the plan's routes serve (or the pool's only
    model). Nothing is stored when anything is refused."""
    actor.require(roles.JOBS, action="conformance.run.create", target=pool)
    if not [u for u in (pool.base_urls or []) if isinstance(u, str) and u.strip()]:
        raise ValidationError({"pool": [f"{pool.name} has no endpoints (base URLs) to probe; "
                                        f"add one to the pool first."]})
    if plan is not None:
        if plan.candidate_pool_id != pool.pk:
            raise ValidationError({"plan": [
                f"Plan {plan.name} migrates to {plan.candidate_pool.name}, not {pool.name}: "
                f"probe {plan.candidate_pool.name}, or leave the plan out."]})
        if primary is not None and primary.pk != plan.primary_pool_id:
            raise ValidationError({"primary": [
                f"Plan {plan.name}'s primary is {plan.primary_pool.name}; leave primary out "
                f"to compare with it, or leave the plan out to compare with {primary.name}."]})
        primary = plan.primary_pool
    if primary is not None and primary.pk == pool.pk:
        raise ValidationError({"primary": ["The reference must be another pool than the one "
                                           "probed."]})
    served = _models_served(pool)
    if not model_id:
        route_models = sorted({r.model_id for r in plan.routes.all()}) if plan else []
        candidates = [m for m in route_models if m in served] or served
        if len(candidates) != 1:
            raise ValidationError({"model": [
                f"{pool.name} serves {', '.join(served) or 'no model'}: name the model to "
                f"probe." if served else
                f"{pool.name} serves no model yet; add one to the pool first."]})
        model_id = candidates[0]
    if model_id not in served:
        raise ValidationError({"model": [f"{pool.name} does not serve {model_id} (it serves "
                                         f"{', '.join(served) or 'no model'})."]})
    if primary is not None and model_id not in _models_served(primary):
        raise ValidationError({"primary": [f"{primary.name} does not serve {model_id}, so it "
                                           f"cannot be the reference for it."]})
    known = suite.by_key()
    keys = sorted(set(required_keys or []))
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise ValidationError({"required": [f"No case {', '.join(unknown)}; cases: "
                                            f"{', '.join(known)}."]})
    if "errors.rate_limit" in keys and not include_saturation:
        raise ValidationError({"required": ["errors.rate_limit runs only with "
                                            "include_saturation: turn it on to require it."]})
    run = ConformanceRun(pool=pool, primary=primary, plan=plan, model_id=model_id,
                         include_saturation=include_saturation, required_keys=keys,
                         created_by=actor.label)
    run.full_clean()
    with transaction.atomic():
        busy = (ConformanceRun.objects.select_for_update()
                .filter(pool=pool, status__in=ConformanceRun.ACTIVE).first())
        if busy is not None:
            raise ConflictError(f"Conformance run {busy.pk} of {pool.name} is still "
                                f"{busy.status}; wait for it (or cancel it) first.")
        run.save()
        audit_record(actor=actor, action="conformance.run.create", target=run,
                     after={"pool": pool.name, "primary": primary.name if primary else None,
                            "plan": plan.name if plan else None, "model": model_id,
                            "include_saturation": include_saturation, "required": keys})
        transaction.on_commit(lambda: _enqueue(run.pk))
    return run


def _enqueue(run_id: int) -> None:
    from fleetctl.conformance.tasks import run_execute

    run_execute.delay(run_id)


def run_cancel(*, actor: Actor, run: ConformanceRun) -> ConformanceRun:
    actor.require(roles.JOBS, action="conformance.run.cancel", target=run)
    with transaction.atomic():
        locked = ConformanceRun.objects.select_for_update().get(pk=run.pk)
        if locked.status not in ConformanceRun.ACTIVE:
            raise ConflictError(f"Conformance run {locked.pk} is {locked.status}; only a queued "
                                f"or running run can be cancelled.")
        locked.status = ConformanceRun.Status.CANCELLED
        locked.finished_at = timezone.now()
        locked.error = f"cancelled by {actor.label}"
        locked.save(update_fields=["status", "finished_at", "error"])
        audit_record(actor=actor, action="conformance.run.cancel", target=locked)
    return locked


# --- execution --------------------------------------------------------------------------------

def cases_for(run: ConformanceRun) -> list[suite.Case]:
    return [c for c in suite.CASES if run.include_saturation or not c.opt_in]


def required(run: ConformanceRun, case: suite.Case) -> bool:
    return case.required or case.key in (run.required_keys or [])


def _probe(pool: Pool, base_url: str, run: ConformanceRun, expected: list[str]) -> suite.Probe:
    entry = PoolModel.objects.filter(pool=pool, model_id=run.model_id).first()
    return suite.Probe(pool_name=pool.name, base_url=base_url, model=run.model_id,
                       expected_models=expected,
                       registry_max_context=entry.max_context_tokens if entry else None)


def _expected_models(run: ConformanceRun) -> list[str]:
    models = {run.model_id}
    if run.plan_id is not None and run.plan is not None:
        models |= {r.model_id for r in run.plan.routes.all()}
    return sorted(models)


def _take(run_id: int) -> ConformanceRun | None:
    """Queued → running; a running run whose heartbeat stopped is taken over (resumed)."""
    stale = timezone.now() - timedelta(seconds=HEARTBEAT_STALE_S / 2)
    with transaction.atomic():
        run = (ConformanceRun.objects.select_for_update(of=("self",))
               .select_related("pool", "primary", "plan").filter(pk=run_id).first())
        if run is None:
            return None
        resumable = (run.status == ConformanceRun.Status.RUNNING
                     and (run.heartbeat_at is None or run.heartbeat_at < stale))
        if run.status != ConformanceRun.Status.QUEUED and not resumable:
            return None  # taken by another worker, finished or cancelled
        now = timezone.now()
        run.status = ConformanceRun.Status.RUNNING
        run.started_at = run.started_at or now
        run.heartbeat_at = now
        run.save(update_fields=["status", "started_at", "heartbeat_at"])
    return run


def _still_running(run: ConformanceRun) -> bool:
    """Beat the heartbeat; False once the run is no longer running (cancelled meanwhile)."""
    return ConformanceRun.objects.filter(pk=run.pk, status=ConformanceRun.Status.RUNNING).update(
        heartbeat_at=timezone.now()) == 1


def _store(run: ConformanceRun, case: suite.Case, position: int, probe: suite.Probe,
           pool: Pool, role: str, outcome: suite.Outcome) -> None:
    request = "" if outcome.request is None else suite._excerpt(outcome.request)
    ConformanceCase.objects.get_or_create(
        run=run, key=case.key, pool=pool, endpoint=probe.base_url,
        defaults={"role": role, "title": case.title, "required": required(run, case),
                  "position": position, "status": outcome.status,
                  "expected": outcome.expected[:500], "got": outcome.got[:1000],
                  "latency_ms": outcome.latency_ms, "request_excerpt": request,
                  "response_excerpt": outcome.response,
                  "numbers": {**outcome.numbers, "brief": outcome.brief[:200]}})


def run_execute(*, run_id: int) -> ConformanceRun | None:
    """The `conformance.run` task: every case on every endpoint of the pool, and the
    non-parity cases on one endpoint of the reference, then the verdict and the evidence."""
    run = _take(run_id)
    if run is None:
        return ConformanceRun.objects.filter(pk=run_id).first()
    done = set(ConformanceCase.objects.filter(run=run)
               .values_list("key", "pool_id", "endpoint"))
    expected = _expected_models(run)
    probes = [_probe(run.pool, url, run, expected) for url in run.pool.base_urls]
    reference = (_probe(run.primary, run.primary.base_urls[0], run, expected)
                 if run.primary is not None and run.primary.base_urls else None)
    try:
        for position, case in enumerate(cases_for(run)):
            targets = [(run.pool, probe, ConformanceCase.Role.POOL) for probe in probes]
            if reference is not None and run.primary is not None and not case.parity:
                targets.append((run.primary, reference, ConformanceCase.Role.PRIMARY))
            for pool, probe, role in targets:
                if (case.key, pool.pk, probe.base_url) in done:
                    continue
                outcome = case.judge(probe, reference if role == "pool" else None)
                _store(run, case, position, probe, pool, role, outcome)
                if not _still_running(run):
                    return ConformanceRun.objects.get(pk=run.pk)  # cancelled meanwhile
    except Exception as exc:
        log.exception("conformance run %s failed", run_id)
        ConformanceRun.objects.filter(pk=run_id, status=ConformanceRun.Status.RUNNING).update(
            status=ConformanceRun.Status.FAILED, finished_at=timezone.now(),
            error=f"{type(exc).__name__}: {exc}")
        return ConformanceRun.objects.get(pk=run_id)
    finally:
        for probe in [*probes, *([reference] if reference else [])]:
            probe.close()
    return _finish(run)


def case_results(run: ConformanceRun) -> list[dict[str, Any]]:
    """Per case of the pool under test, its rows over the endpoints added up (worst wins)."""
    rows = list(ConformanceCase.objects.filter(run=run, role=ConformanceCase.Role.POOL)
                .order_by("position", "endpoint"))
    merged: dict[str, dict[str, Any]] = {}
    for row in rows:
        item = merged.setdefault(row.key, {"key": row.key, "required": row.required,
                                           "status": row.status, "rows": []})
        item["rows"].append(row)
        if SEVERITY[row.status] > SEVERITY[item["status"]]:
            item["status"] = row.status
    return list(merged.values())


def _phrase(item: dict[str, Any]) -> str:
    case = suite.by_key().get(item["key"])
    label = case.label if case else item["key"]
    bad = [r for r in item["rows"] if r.status == item["status"]]
    brief = (bad[0].numbers or {}).get("brief") or bad[0].got
    where = (f"; on {len(bad)} of {len(item['rows'])} endpoints"
             if len(bad) < len(item["rows"]) else "")
    return f"{label} ({brief[:80]}{where})"


def summarise(run: ConformanceRun) -> tuple[str, str, dict[str, int], dict[str, Any]]:
    """(verdict, summary, counts, evidence data) from the stored rows."""
    items = case_results(run)
    counts = {status: sum(1 for i in items if i["status"] == status)
              for status in (suite.PASS, suite.FAIL, suite.ERROR, suite.SKIP)}
    counts["total"] = len(items)
    judged = counts["total"] - counts[suite.SKIP]
    failing = [i for i in items if i["status"] in (suite.FAIL, suite.ERROR)]
    hard = [i for i in failing if i["required"]]
    soft = [i for i in failing if not i["required"]]
    verdict = "fail" if hard else "warn" if soft else "pass"
    parts = [f"{counts[suite.PASS]} of {judged} cases pass"]
    if hard:
        parts.append("required failing: " + ", ".join(_phrase(i) for i in hard))
    if soft:
        parts.append("optional failing: " + ", ".join(_phrase(i) for i in soft))
    if counts[suite.SKIP]:
        parts.append(f"{counts[suite.SKIP]} skipped")
    data = {"run": run.pk, "counts": counts, "failing": [i["key"] for i in failing],
            "required_failing": [i["key"] for i in hard],
            "cases": {i["key"]: i["status"] for i in items},
            "primary": run.primary.name if run.primary else None,
            "endpoints": list(run.pool.base_urls), "model": run.model_id}
    return verdict, "; ".join(parts), counts, data


def _finish(run: ConformanceRun) -> ConformanceRun:
    from migrations_plan.services import evidence_record

    verdict, summary, counts, data = summarise(run)
    system = Actor.for_system(PRODUCER)
    route = (run.plan.routes.filter(model_id=run.model_id).order_by("name").first()
             if run.plan is not None else None)
    with transaction.atomic():
        locked = ConformanceRun.objects.select_for_update().get(pk=run.pk)
        if locked.status != ConformanceRun.Status.RUNNING:
            return locked
        evidence = evidence_record(actor=system, pool=run.pool, kind=KIND, verdict=verdict,
                                   summary=summary, data=data, route=route,
                                   model_id=run.model_id, source=f"conformance run {run.pk}",
                                   url=f"/conformance/runs/{run.pk}/")
        now = timezone.now()
        locked.status = ConformanceRun.Status.DONE
        locked.verdict = verdict
        locked.summary = summary[:600]
        locked.counts = counts
        locked.evidence_id = evidence.pk
        locked.finished_at = locked.heartbeat_at = now
        locked.save(update_fields=["status", "verdict", "summary", "counts", "evidence_id",
                                   "finished_at", "heartbeat_at"])
        audit_record(actor=system, action="conformance.run.finish", target=locked,
                     message=f"{verdict}: {summary}"[:2000],
                     after={"verdict": verdict, "counts": counts, "evidence": evidence.pk})
    return locked


def runs_reap(*, stale_after_s: float = HEARTBEAT_STALE_S) -> int:
    """Beat: a running run whose heartbeat stopped (its worker died) is failed, keeping the
    cases it judged; a run no worker took within QUEUED_STALE_S is failed too."""
    now = timezone.now()
    count = 0
    stale = ConformanceRun.objects.filter(status=ConformanceRun.Status.RUNNING,
                                          heartbeat_at__lt=now - timedelta(seconds=stale_after_s))
    for run in stale:
        count += ConformanceRun.objects.filter(
            pk=run.pk, status=ConformanceRun.Status.RUNNING).update(
            status=ConformanceRun.Status.FAILED, finished_at=now,
            error=f"the worker running it stopped (no heartbeat since "
                  f"{run.heartbeat_at:%Y-%m-%d %H:%M:%S} UTC); the cases judged so far are kept "
                  f"and no evidence was recorded")
    count += ConformanceRun.objects.filter(
        status=ConformanceRun.Status.QUEUED,
        created_at__lt=now - timedelta(seconds=QUEUED_STALE_S)).update(
        status=ConformanceRun.Status.FAILED, finished_at=now,
        error=f"no worker started it within {QUEUED_STALE_S // 60} minutes: is a Celery worker "
              f"consuming the probe queue?")
    return count
