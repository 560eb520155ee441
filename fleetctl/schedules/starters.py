"""What a schedule starts: (job kind, job id, what was started), as `system:schedule`, with the
same services a person's click calls. Each raises the service's ValidationError or DomainError
when the start is refused (the caller records a `failed` run)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

from django.core.exceptions import ValidationError

from fleetctl.accounts.actor import Actor
from fleetctl.evals.models import EvalSuite
from fleetctl.fleet.models import Pool
from fleetctl.schedules.models import Schedule
from migrations_plan.models import Plan

ACTOR = Actor.for_system("schedule")


def target_pool(schedule: Schedule) -> Pool:
    pool = schedule.target_pool
    assert pool is not None, f"schedule {schedule.pk} has no pool"
    return pool


def _plan(schedule: Schedule) -> Plan:
    assert schedule.plan is not None, f"schedule {schedule.pk} has no plan"
    return schedule.plan


def when(at: datetime, schedule: Schedule) -> str:
    return f"{at.astimezone(ZoneInfo(schedule.timezone)):%Y-%m-%d %H:%M} {schedule.timezone}"


def _conformance(schedule: Schedule) -> tuple[str, int, str]:
    from fleetctl.conformance.services import run_create

    pool = target_pool(schedule)
    run = run_create(actor=ACTOR, pool=pool, plan=schedule.plan)
    against = f" against {run.primary.name}" if run.primary is not None else ""
    return "conformance.run", run.pk, f"conformance run {run.pk} of {pool.name}{against}"


def _last_benchmark(pool: Pool) -> Any:
    from fleetctl.bench.models import Run

    return (Run.objects.filter(pools=pool).exclude(status__in=(Run.Status.FAILED,
                                                               Run.Status.CANCELLED))
            .order_by("-created_at", "-pk").first())


def benchmark_same_day(schedule: Schedule, now: datetime) -> str:
    pool = target_pool(schedule)
    last = _last_benchmark(pool)
    if last is None:
        return ""
    tz = ZoneInfo(schedule.timezone)
    if last.created_at.astimezone(tz).date() == now.astimezone(tz).date():
        return (f"{pool.name}'s last benchmark (run {last.pk}, {when(last.created_at, schedule)}) "
                f"is from the same day ({now.astimezone(tz):%Y-%m-%d} {schedule.timezone}); "
                f"a repeat must be on another day.")
    return ""


def _benchmark(schedule: Schedule) -> tuple[str, int, str]:
    from fleetctl.bench.services import run_create

    pool = target_pool(schedule)
    last = _last_benchmark(pool)
    if last is None:
        raise ValidationError({"pool": [
            f"{pool.name} has no benchmark run to repeat: run one (Benchmarks → New run, or "
            f"`fleetctl bench run`), and this schedule repeats it on another day."]})
    run = run_create(
        actor=ACTOR, trace=last.trace, pools=list(last.pools.all()), model_id=last.model_id,
        slo_ttft_p95_ms=last.slo_ttft_p95_ms, slo_tpot_p95_ms=last.slo_tpot_p95_ms,
        slo_error_rate=last.slo_error_rate, mode=last.mode, levels=list(last.levels),
        max_concurrency=last.max_concurrency, warmup_s=last.warmup_s, window_s=last.window_s,
        ramp_s=last.ramp_s, min_samples=last.min_samples, shards=last.shards,
        lag_limit_ms=last.lag_limit_ms, name=f"schedule {schedule.pk}: repeat of run "
                                             f"{last.pk}"[:100],
        timing=last.timing, speeds=list(last.speeds))
    return "bench.run", run.pk, f"benchmark run {run.pk} started, repeating run {last.pk}"


def last_eval_suite(plan: Plan) -> EvalSuite | None:
    from fleetctl.evals.models import EvalRun

    last = EvalRun.objects.filter(plan=plan).select_related("suite").order_by(
        "-created_at", "-pk").first()
    return last.suite if last is not None else None


def _eval(schedule: Schedule) -> tuple[str, int, str]:
    from fleetctl.evals.services import run_create

    plan = _plan(schedule)
    suite = schedule.eval_suite or last_eval_suite(plan)
    if suite is None:
        raise ValidationError({"eval_suite": [f"Plan {plan.name} has no eval run to take the "
                                              f"suite from: name one on the schedule."]})
    run = run_create(actor=ACTOR, suite=suite, plan=plan)
    return "eval.run", run.pk, f"eval run {run.pk} of suite {suite.label} started"


STARTERS: dict[str, Callable[[Schedule], tuple[str, int, str]]] = {
    Schedule.Kind.CONFORMANCE: _conformance,
    Schedule.Kind.BENCHMARK: _benchmark,
    Schedule.Kind.EVAL: _eval,
}
