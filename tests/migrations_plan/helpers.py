"""Walking a plan through its gates the way people would: attest what needs a person,
approve (with a justification where the evidence is not a clean pass), advance."""

from __future__ import annotations

from migrations_plan import evidence as ev
from migrations_plan import services
from migrations_plan.models import GateCheck, Plan

ATTESTER = {"platform-lead": "lead", "on-call": "oncall", "admin": "admin"}


def attest_all(world, plan: Plan) -> None:
    for check in plan.checks.filter(stage=plan.stage, removed_at__isnull=True,
                                    kind=GateCheck.Kind.ATTESTED):
        if not check.attestations.filter(withdrawn_at__isnull=True).exists():
            services.attest(actor=world.actor(ATTESTER.get(check.attest_role, "admin")),
                            check=check, note=f"confirmed for stage {plan.stage}")


def pass_gate(world, plan: Plan, approvers: tuple[str, ...] = ("lead",)) -> Plan:
    attest_all(world, plan)
    for who in approvers:
        services.approve(actor=world.actor(who), plan=plan,
                         justification="signed off on the evidence shown")
    return services.advance(actor=world.actor(approvers[0]), plan=plan, reason="gate passed")


def walk_to(world, plan: Plan, stage: int) -> Plan:
    while plan.stage < stage:
        plan = pass_gate(world, plan)
    assert plan.stage == stage and plan.state == f"stage-{stage}"
    return plan


def gate_status(plan: Plan) -> dict[str, str]:
    return {o.check.key: o.status for o in ev.evaluate_gate(plan).outcomes}
