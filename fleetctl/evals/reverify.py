"""After a changed candidate's conformance re-run passed: the plan's last eval suite again
(registered in apps.py with migrations_plan.reverify)."""

from __future__ import annotations

from django.core.exceptions import ValidationError

from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.core.errors import DomainError
from fleetctl.evals.models import EvalRun
from migrations_plan.models import Plan


def eval_again(plan: Plan, actor: Actor) -> EvalRun | None:
    """A run of the suite of the plan's last eval run (same model, concurrency, sample
    size and confidence), by `actor`; none when the plan never ran one. On the plan's
    record either way."""
    from fleetctl.evals import services

    last = (EvalRun.objects.filter(plan=plan).select_related("suite")
            .order_by("-created_at", "-id").first())
    if last is None:
        audit_record(actor=actor, action="plan.reverify", target=plan,
                     message=f"conformance re-verified {plan.candidate_pool.name}; no eval "
                             f"run of this plan to repeat")
        return None
    try:
        run = services.run_create(actor=actor, suite=last.suite, plan=plan,
                                  model_id=last.model_id, concurrency=last.concurrency,
                                  min_items=last.min_items, confidence=last.confidence)
    except (ValidationError, DomainError) as exc:
        audit_record(actor=actor, action="plan.reverify", target=plan,
                     message=f"the eval re-run ({last.suite.label}) could not be started: "
                             f"{exc}"[:2000])
        return None
    audit_record(actor=actor, action="plan.reverify", target=plan,
                 message=f"conformance re-verified {plan.candidate_pool.name}: eval run "
                         f"{run.pk} started with {last.suite.label} (the plan's last suite)",
                 after={"eval_run": run.pk})
    return run
