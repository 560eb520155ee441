"""Writes for the conformance probe: start a run, execute it, cancel it, fail the ones whose
worker stopped, and record what a finished run found as `conformance` evidence.

A run probes every endpoint (base URL) of the pool under test, so one drifting replica is
caught, and one endpoint of the reference pool (the plan's primary, or one named), side by
side. It talks to each endpoint directly, never through a route. Every case's result is a
`ConformanceCase` row written as soon as it is judged; the run beats a heartbeat after each.
A worker that dies leaves the rows it wrote: a redelivered task resumes the run from them
(skipping what is stored) and the reaper (beat, every minute) fails a run whose heartbeat
stopped, so no run stays "running".

Verdict: fail when a required case fails (or errs) on the pool under test; warn when only
optional ones do, or a required one was skipped (parity with no reference pool: a warn is
approvable only with a written reason); pass otherwise. The summary names the reference.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.core.exceptions import ValidationError
from django.db import transaction

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.conformance import cases as suite
from fleetctl.conformance.evidence import KIND
from fleetctl.conformance.models import ConformanceCase, ConformanceRun
from fleetctl.core.errors import ConflictError
from fleetctl.fleet.models import Pool, PoolModel
from migrations_plan import jobs

if TYPE_CHECKING:
    from migrations_plan.models import Plan

log = logging.getLogger("fleetctl.conformance")
HEARTBEAT_STALE_S = 300
QUEUED_STALE_S = 900
PRODUCER = "conformance-probe"
# Worst first: how one case's rows over several endpoints add up.
SEVERITY = {suite.ERROR: 3, suite.FAIL: 2, suite.PASS: 1, suite.SKIP: 0}


def _required(keys: Iterable[str] | None, include_saturation: bool) -> list[str]:
    """The case keys a run requires beyond the default set, checked."""
    known = suite.by_key()
    keys = sorted(set(keys or []))
    unknown = [k for k in keys if k not in known]
    if unknown:
        raise ValidationError({"required": [f"No case {', '.join(unknown)}; cases: "
                                            f"{', '.join(known)}."]})
    if "errors.rate_limit" in keys and not include_saturation:
        raise ValidationError({"required": ["errors.rate_limit runs only with "
                                            "include_saturation: turn it on to require it."]})
    return keys


def run_create(*, actor: Actor, pool: Pool, plan: Plan | None = None,
               primary: Pool | None = None, model_id: str = "",
               include_saturation: bool = False,
               required_keys: Iterable[str] | None = None) -> ConformanceRun:
    """Queue a probe of `pool`. With a plan, the pool must be its candidate and the reference
    is its primary; the model defaults to the one the plan's routes serve (or the pool's only
    model): jobs.resolve_plan_targets. Nothing is stored when anything is refused."""
    actor.require(roles.JOBS, action="conformance.run.create", target=pool)
    targets = jobs.resolve_plan_targets(plan, noun="conformance runs", candidate=pool,
                                        primary=primary, model_id=model_id,
                                        fields={"candidate": "pool"})
    primary, model_id = targets.primary, targets.model_id
    keys = _required(required_keys, include_saturation)
    run = ConformanceRun(pool=pool, primary=primary, plan=plan, model_id=model_id,
                         plan_stage=plan.stage if plan is not None else None,
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
    return jobs.cancel(actor, run, action="conformance.run.cancel", noun="Conformance run")


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
    if not jobs.take(ConformanceRun, run_id, worker=socket.gethostname(),
                     resume_after_s=HEARTBEAT_STALE_S / 2):
        return None  # taken by another worker, finished or cancelled
    return ConformanceRun.objects.select_related("pool", "primary", "plan").get(pk=run_id)


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
                if not jobs.heartbeat(run):
                    return ConformanceRun.objects.get(pk=run.pk)  # cancelled meanwhile
    except Exception as exc:
        log.exception("conformance run %s failed", run_id)
        jobs.fail(run, f"{type(exc).__name__}: {exc}")
        return ConformanceRun.objects.get(pk=run_id)
    finally:
        for probe in [*probes, *([reference] if reference else [])]:
            probe.close()
    finished = _finish(run)
    _after(finished)
    return finished


def _after(run: ConformanceRun) -> None:
    """A re-verification probe (by system:reverify) goes on: eval, benchmark, or the routes'
    policy (reverify.after_run). Its trouble never undoes the finished run."""
    from fleetctl.conformance import reverify

    if run.created_by != reverify.ACTOR.label:
        return
    try:
        reverify.after_run(run)
    except Exception:
        log.exception("re-verification after conformance run %s failed", run.pk)


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
    # A required case that was not judged (parity with no reference pool to compare with)
    # proves nothing either way: the probe cannot pass, and a person accepts it or not.
    unjudged = [i for i in items if i["status"] == suite.SKIP and i["required"]]
    verdict = "fail" if hard else "warn" if soft or unjudged else "pass"
    parts = [f"{counts[suite.PASS]} of {judged} cases pass"]
    if hard:
        parts.append("required failing: " + ", ".join(_phrase(i) for i in hard))
    if soft:
        parts.append("optional failing: " + ", ".join(_phrase(i) for i in soft))
    if unjudged:
        parts.append("required but not judged: " + ", ".join(_phrase(i) for i in unjudged))
    if counts[suite.SKIP]:
        parts.append(f"{counts[suite.SKIP]} skipped")
    parts.append(f"reference {run.primary.name}" if run.primary else "no reference pool")
    data = {"run": run.pk, "counts": counts, "failing": [i["key"] for i in failing],
            "required_failing": [i["key"] for i in hard],
            "required_skipped": [i["key"] for i in unjudged],
            "cases": {i["key"]: i["status"] for i in items},
            "primary": run.primary.name if run.primary else None,
            "endpoints": list(run.pool.base_urls), "model": run.model_id}
    return verdict, "; ".join(parts), counts, data


def _finish(run: ConformanceRun) -> ConformanceRun:
    """Complete, with the verdict recorded as `conformance` evidence (jobs.finish: once)."""
    verdict, summary, counts, data = summarise(run)

    def evidence(locked: ConformanceRun) -> dict[str, Any]:
        from migrations_plan.services import evidence_record

        route = (run.plan.routes.filter(model_id=run.model_id).order_by("name").first()
                 if run.plan is not None else None)
        row = evidence_record(actor=Actor.for_system(PRODUCER), pool=run.pool, kind=KIND,
                              verdict=verdict, summary=summary, data=data, route=route,
                              model_id=run.model_id, source=f"conformance run {run.pk}",
                              url=f"/conformance/runs/{run.pk}/")
        locked.evidence_id = row.pk
        locked.save(update_fields=["evidence_id"])
        return {"evidence": row.pk}

    return jobs.finish(run, actor=Actor.for_system(PRODUCER),
                       action="conformance.run.finish", evidence=evidence,
                       fields={"verdict": verdict, "summary": summary[:600], "counts": counts},
                       message=f"{verdict}: {summary}",
                       after={"verdict": verdict, "counts": counts})


def runs_reap(*, stale_after_s: float = HEARTBEAT_STALE_S) -> int:
    """Beat: a running run whose heartbeat stopped (its worker died) is failed, keeping the
    cases it judged (policy FAIL: a redelivered task resumes it first, within half the stale
    period, when the broker still has it); a run no worker took within QUEUED_STALE_S is
    failed too. Neither records evidence."""
    return jobs.reap(ConformanceRun, policy=jobs.Reap.FAIL, stale_after_s=stale_after_s,
                     queued_after_s=QUEUED_STALE_S, queue="probe",
                     kept="the cases judged so far are kept and no evidence was recorded")
