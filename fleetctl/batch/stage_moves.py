"""A plan's stage move and the batch work on its candidate.

Batch jobs on a plan's candidate need the plan at stage 3 or later (targets.py). That rule
was checked only when a job was created, so a plan sent back from stage 3 left its
candidate's queued and running jobs going. Now every stage move (migrations_plan's
STAGE_MOVE_HOOKS, registered in apps.py) re-checks it: the jobs the candidate may no longer
run are paused in the move's transaction, as a person's pause does (the holder stops
dispatching, lets the requests in flight finish and releases its chunk), on each job's
timeline and in the audit log, by `system:plan-<name>`, with the move's reason. They stay
paused; resuming one is refused until the plan is back at stage 3.
"""

from __future__ import annotations

from fleetctl.accounts.actor import Actor
from fleetctl.audit.services import audit_record
from fleetctl.batch.models import BatchJob, BatchJobEvent
from fleetctl.batch.services import job_event
from fleetctl.batch.targets import job_target_refusal
from migrations_plan.models import Plan, StageMove


def pause_jobs_the_stage_no_longer_allows(plan: Plan, move: StageMove) -> list[BatchJob]:
    """Pause the candidate's queued and running jobs if the plan's new stage refuses them."""
    refusal = job_target_refusal(plan.candidate_pool)
    if refusal is None:
        return []
    system = Actor.for_system(f"plan-{plan.name}")
    jobs = list(BatchJob.objects.select_for_update(of=("self",))
                .filter(pool=plan.candidate_pool,
                        state__in=(BatchJob.State.QUEUED, BatchJob.State.RUNNING))
                .order_by("pk"))
    why = (f"plan {plan.name} moved from {move.from_state} to {move.to_state} "
           f"({move.by}: {move.reason}); {refusal}")
    for job in jobs:
        before = job.state
        job.state, job.state_reason = BatchJob.State.PAUSED, why[:2000]
        job.save(update_fields=["state", "state_reason"])
        job_event(job, BatchJobEvent.Kind.PAUSED, system.label,
                  message=f"Paused by the plan's stage move: {why}",
                  data={"plan": plan.name, "move": move.pk})
        audit_record(actor=system, action="batch.job_pause", target=job, message=why,
                     before={"state": before}, after={"state": BatchJob.State.PAUSED,
                                                      "move": move.pk})
    return jobs
