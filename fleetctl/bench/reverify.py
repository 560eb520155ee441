"""After a changed candidate's conformance re-run passed: its last benchmark again, where a
route of the plan asks (`reverify_benchmark`) and the plan's gate has a benchmark check
(registered in apps.py with migrations_plan.reverify)."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.bench.models import Run
from fleetctl.core.errors import DomainError
from migrations_plan.models import Plan


def benchmark_again(plan: Plan, actor: Actor) -> Run | None:
    """The last benchmark that measured the candidate (same trace, pools, model, SLO and
    load), by `actor`; None when no route of the plan asks, the gate has no benchmark check,
    or there is no benchmark to repeat (said on the plan's record)."""
    from fleetctl.bench.services import run_create

    if not plan.routes.filter(reverify_benchmark=True).exists():
        return None
    if not plan.checks.filter(removed_at__isnull=True, rule__startswith="benchmark.").exists():
        return None
    last = (Run.objects.filter(pools=plan.candidate_pool).select_related("trace")
            .order_by("-created_at", "-id").first())
    if last is None:
        audit_record(actor=actor, action="plan.reverify", target=plan,
                     message=f"no benchmark of {plan.candidate_pool.name} to repeat")
        return None
    try:
        run = run_create(
            actor=actor, trace=last.trace, pools=list(last.pools.all()),
            model_id=last.model_id, slo_ttft_p95_ms=last.slo_ttft_p95_ms,
            slo_tpot_p95_ms=last.slo_tpot_p95_ms, slo_error_rate=last.slo_error_rate,
            mode=last.mode, levels=list(last.levels), max_concurrency=last.max_concurrency,
            warmup_s=last.warmup_s, window_s=last.window_s, ramp_s=last.ramp_s,
            min_samples=last.min_samples, shards=last.shards, lag_limit_ms=last.lag_limit_ms,
            name=f"re-verification of {plan.candidate_pool.name}"[:100], timing=last.timing,
            speeds=list(last.speeds))
    except (ValidationError, DomainError) as exc:
        audit_record(actor=actor, action="plan.reverify", target=plan,
                     message=f"the benchmark re-run could not be started: {exc}"[:2000])
        return None
    audit_record(actor=actor, action="plan.reverify", target=plan,
                 message=f"benchmark run {run.pk} started again (as run {last.pk})",
                 after={"bench_run": run.pk})
    return run
