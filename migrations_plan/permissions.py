"""What a person may do with a plan's gate, and why not: the one place that decides.

`decide` answers, for one actor and one gate evaluated now, whether they may approve it,
advance the plan, and attest each of its checks; when they may not, a `Refusal` says why, in
a sentence they can act on. The services enforce these answers (they raise the refusal's
error); the plan page and the API only show them. So an enabled button is one the service
accepts, and a disabled one carries what the service would answer.

`approval_standings` decides whether an approval still counts: not voided, not used by a
stage move, and given on exactly the evidence the gate shows now (nothing it saw expired).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import ValidationError

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.core.errors import ConflictError, PermissionDeniedError
from migrations_plan import evidence as ev
from migrations_plan.models import STAGE_NAMES, Approval, Attestation, GateCheck, Plan

MIN_JUSTIFICATION = 15
APPROVE, ADVANCE = "approve", "advance"
# What the person does, in the words of a refusal: (needs a named person, separation of duties).
_DOING = {APPROVE: ("Approving", "approve its gates"),
          ADVANCE: ("Advancing a plan", "advance it")}

# Why not, as a code the page and tests can tell apart.
ROLE = "role"
PERSON = "person"
TOKEN = "token"
AUTHOR = "author"
OWNER = "owner"
CLOSED = "closed"
PAUSED = "paused"
OTHER_STAGE = "other-stage"
BLOCKED = "blocked"
JUSTIFICATION = "justification"
ALREADY_APPROVED = "already-approved"
APPROVALS = "approvals"
EVIDENCE_BACKED = "evidence-backed"
ATTEST_ROLE = "attest-role"
REMOVED = "removed"
BEHIND = "behind"
ALREADY_ATTESTED = "already-attested"


@dataclass(frozen=True)
class Refusal:
    """Why an actor may not do something now. `reason` is what the plan page shows beside the
    disabled button; `message` is what the service answers when asked anyway, as `error`
    (403: not yours to do, 409: not now, 400: fix the input, on `field`)."""

    code: str
    reason: str
    message: str
    error: type[Exception] = ConflictError
    field: str = ""

    def exception(self) -> Exception:
        if self.error is ValidationError:
            return ValidationError({self.field: [self.message]})
        return self.error(self.message)


def enforce(refusal: Refusal | None) -> None:
    """Raise the refusal's error, if there is one."""
    if refusal is not None:
        raise refusal.exception()


def _same(code: str, text: str, error: type[Exception] = ConflictError,
          field: str = "") -> Refusal:
    """A refusal the page and the service word alike."""
    return Refusal(code=code, reason=text, message=text, error=error, field=field)


# --- whether an approval still counts -------------------------------------------------------

@dataclass(frozen=True)
class ApprovalStanding:
    """An approval and, when it does not count towards advancing on this gate, why not."""

    approval: Approval
    why_not: str | None

    @property
    def counts(self) -> bool:
        return self.why_not is None

    @property
    def stale_reason(self) -> str | None:
        """Why an approval not yet voided no longer holds (the evidence moved since)."""
        return self.why_not if self.approval.is_active else None


def approval_standings(approvals: Iterable[Approval], gate: ev.GateEvaluation
                       ) -> list[ApprovalStanding]:
    """Whether each approval still counts on `gate`, and if not why: voided, used by a stage
    move, given for another stage, or given on evidence that changed or expired since."""
    current: tuple[dict[str, Any], str] | None = None
    standings = []
    for approval in approvals:
        why: str | None
        if approval.voided_at is not None:
            why = f"voided: {approval.void_reason}"
        elif approval.used_at is not None:
            why = f"used by the stage move at {approval.used_at:%Y-%m-%d %H:%M} UTC"
        elif approval.stage != gate.stage:
            why = f"given for stage {approval.stage}, not stage {gate.stage}"
        else:
            if current is None:
                snapshot = gate.snapshot()
                current = (snapshot, ev.snapshot_hash(snapshot))
            why = ev.snapshot_difference(approval.snapshot, current[0], gate.at)
            if why is None and approval.snapshot_hash != current[1]:
                why = "the gate's evidence changed"
        standings.append(ApprovalStanding(approval=approval, why_not=why))
    return standings


def stage_approvals(plan: Plan, gate: ev.GateEvaluation) -> list[ApprovalStanding]:
    """Every approval of the gate's stage, newest first, each with its standing."""
    rows = plan.approvals.filter(stage=gate.stage).select_related("by").order_by("-at", "-id")
    return approval_standings(rows, gate)


# --- the parts of a decision ----------------------------------------------------------------

def person_refusal(actor: Actor, doing: str) -> Refusal | None:
    """Approvals, attestations and authorship belong to a named person signed in."""
    if actor.user is None or not getattr(actor.user, "pk", None):
        return _same(PERSON, f"{doing} needs a named person; {actor.label} is not one.",
                     PermissionDeniedError)
    return None


def closed_refusal(plan: Plan) -> Refusal | None:
    if plan.is_open:
        return None
    return Refusal(CLOSED, f"Plan is {plan.state}; a closed plan takes no approvals or moves.",
                   f"Plan {plan.name} is {plan.state}; a closed plan cannot be changed.")


def behind_refusal(plan: Plan, stage: int) -> Refusal | None:
    """A stage the plan has left: its gate is part of the record."""
    if stage >= plan.stage:
        return None
    return _same(BEHIND, f"Stage {stage} ({STAGE_NAMES[stage]}) is behind plan {plan.name}; its "
                         f"gate is part of the record and cannot be edited.")


def decider_refusal(actor: Actor, plan: Plan, action: str) -> Refusal | None:
    """What approving and advancing need before the gate is looked at: the platform-lead
    role, a named person, and someone other than whoever opened or owns the plan (separation
    of duties: every stage move involves a second platform lead)."""
    if not actor.can(roles.APPROVE):
        return _same(ROLE, actor.denial_message(roles.APPROVE), PermissionDeniedError)
    doing, duty = _DOING[action]
    refusal = person_refusal(actor, doing)
    if refusal is not None:
        return refusal
    person_id = actor.user.pk
    if person_id not in (plan.created_by_id, plan.owner_id):
        return None
    opened = person_id == plan.created_by_id
    who = "opened" if opened else "own"
    return Refusal(AUTHOR if opened else OWNER,
                   f"You {who} this plan; another platform lead must {duty}.",
                   f"You {who} plan {plan.name}; separation of duties: another platform lead "
                   f"must {duty}.", PermissionDeniedError)


def _stage_refusal(plan: Plan, gate: ev.GateEvaluation) -> Refusal | None:
    """Approvals and moves happen on the current stage of a plan that is at a stage."""
    refusal = closed_refusal(plan)
    if refusal is not None:
        return refusal
    if not plan.in_stage:
        return Refusal(PAUSED, f"Plan is paused at stage {plan.stage}; resume it first.",
                       f"Plan {plan.name} is {plan.state}; resume it first.")
    if gate.stage != plan.stage:
        return _same(OTHER_STAGE, f"Approving and advancing happen on the current stage "
                                  f"({plan.stage} · {plan.stage_name}).")
    return None


def _blocked_refusal(gate: ev.GateEvaluation, action: str) -> Refusal | None:
    if not gate.blockers:
        return None
    detail = "; ".join(f"{o.check.title} — {o.result.summary}" for o in gate.blockers)
    return Refusal(
        BLOCKED,
        "Blocked by: " + "; ".join(f"{o.check.title} ({ev.STATUS_LABELS[o.status]})"
                                   for o in gate.blockers) + ".",
        f"The stage {gate.stage} gate cannot be approved: {detail}" if action == APPROVE
        else f"Stage {gate.stage} gate blocks: {detail}")


def justification_refusal(gate: ev.GateEvaluation, justification: str) -> Refusal | None:
    """Warn or insufficient data is approvable only with a written reason."""
    if not gate.needs_justification or len(justification.strip()) >= MIN_JUSTIFICATION:
        return None
    return _same(JUSTIFICATION,
                 f"{len(gate.needs_justification)} check(s) are not a clean pass ("
                 + ", ".join(f"{o.check.title}: {ev.STATUS_LABELS[o.status]}"
                             for o in gate.needs_justification)
                 + f"); write why you approve anyway (at least {MIN_JUSTIFICATION} "
                   f"characters).", ValidationError, field="justification")


def approve_refusal(plan: Plan, gate: ev.GateEvaluation, actor: Actor,
                    approvals: list[ApprovalStanding], *,
                    justification: str | None = None) -> Refusal | None:
    """Why `actor` may not approve `gate` now (None: they may). `justification` is checked
    when given; the page asks for it on the form instead."""
    refusal = (decider_refusal(actor, plan, APPROVE) or _stage_refusal(plan, gate)
               or _blocked_refusal(gate, APPROVE))
    if refusal is None and justification is not None:
        refusal = justification_refusal(gate, justification)
    if refusal is not None:
        return refusal
    mine = next((a for a in approvals if a.counts and a.approval.by_id == actor.user.pk), None)
    if mine is not None:
        return Refusal(ALREADY_APPROVED, "You already approved this gate on this evidence.",
                       f"You already approved this gate at {mine.approval.at:%Y-%m-%d %H:%M} "
                       f"UTC on the same evidence.")
    return None


def advance_refusal(plan: Plan, gate: ev.GateEvaluation, actor: Actor,
                    approvals: list[ApprovalStanding]) -> Refusal | None:
    """Why `actor` may not move the plan past `gate` now (None: they may)."""
    refusal = (decider_refusal(actor, plan, ADVANCE) or _stage_refusal(plan, gate)
               or _blocked_refusal(gate, ADVANCE))
    if refusal is not None:
        return refusal
    counting = sum(1 for a in approvals if a.counts)
    required = plan.required_approvals
    if counting >= required:
        return None
    # Approvals that stopped counting: voided, or about to be (the service voids them first).
    lapsed = [a for a in approvals if not a.counts and a.approval.used_at is None][:3]
    detail = "".join(f" Voided: {a.approval.by.get_username()} — "
                     f"{a.approval.void_reason if a.approval.voided_at else a.why_not}."
                     for a in lapsed)
    return Refusal(
        APPROVALS,
        f"Needs {required} approval{'s' if required != 1 else ''} on the current evidence, "
        f"has {counting}.",
        f"Stage {plan.stage} needs {required} approval(s) on the current evidence; it has "
        f"{counting}.{detail}")


def attester_refusal(actor: Actor, check: GateCheck) -> Refusal | None:
    """Who may attest a check: a named person, signed in, holding the check's role (or
    admin), and only an attested check."""
    refusal = person_refusal(actor, "Attesting")
    if refusal is not None:
        return refusal
    if actor.token is not None:
        return _same(TOKEN, "Attest from the dashboard, signed in; not with a token.",
                     PermissionDeniedError)
    if check.kind != GateCheck.Kind.ATTESTED:
        return _same(EVIDENCE_BACKED,
                     f"Check {check.title!r} is evidence-backed; its rule decides it.",
                     ValidationError, field="check")
    held = actor.roles
    if check.attest_role not in held and roles.ADMIN not in held:
        return Refusal(ATTEST_ROLE,
                       f"Only a {check.attest_role} (or an admin) can attest this.",
                       f"Check {check.title!r} is attested by a {check.attest_role}; you have "
                       f"{', '.join(sorted(held)) or 'no role'}.", PermissionDeniedError)
    return None


def attest_refusal(plan: Plan, check: GateCheck, actor: Actor,
                   standing: Attestation | None) -> Refusal | None:
    """Why `actor` may not attest `check` now (None: they may). `standing` is the check's
    attestation not withdrawn, if any."""
    refusal = attester_refusal(actor, check) or closed_refusal(plan)
    if refusal is not None:
        return refusal
    if check.removed_at is not None:
        return _same(REMOVED, f"Check {check.title!r} was removed from the gate.")
    refusal = behind_refusal(plan, check.stage)
    if refusal is not None:
        return refusal
    if standing is not None:
        return _same(ALREADY_ATTESTED, f"Already attested by {standing.by.get_username()} at "
                                       f"{standing.at:%Y-%m-%d %H:%M} UTC.")
    return None


def standing_attestation(check: GateCheck) -> Attestation | None:
    """The check's attestation not withdrawn (from prefetched rows)."""
    return next((a for a in check.attestations.all() if a.withdrawn_at is None), None)


# --- the decision ---------------------------------------------------------------------------

@dataclass
class GateDecision:
    """What one actor may do with one gate now; each refusal is None when they may."""

    plan: Plan
    gate: ev.GateEvaluation
    approvals: list[ApprovalStanding]
    approve: Refusal | None
    advance: Refusal | None
    attest: dict[int, Refusal | None]  # by check id

    @property
    def approve_blocked(self) -> str:
        return self.approve.reason if self.approve else ""

    @property
    def advance_blocked(self) -> str:
        return self.advance.reason if self.advance else ""

    @property
    def role_missing(self) -> bool:
        """The actor lacks the role to approve or advance at all (the page says so once)."""
        return self.approve is not None and self.approve.code == ROLE

    @property
    def needs_justification(self) -> list[ev.CheckOutcome]:
        return self.gate.needs_justification

    @property
    def counting(self) -> int:
        return sum(1 for a in self.approvals if a.counts)

    @property
    def required(self) -> int:
        return self.plan.required_approvals


def decide(plan: Plan, gate: ev.GateEvaluation, actor: Actor, *,
           approvals: list[ApprovalStanding] | None = None) -> GateDecision:
    """What `actor` may do with `gate` (any stage's evaluation of `plan`): approve, advance,
    attest each check, and why not. `approvals` are the gate stage's approvals with their
    standing (read when not given)."""
    standings = stage_approvals(plan, gate) if approvals is None else approvals
    return GateDecision(
        plan=plan, gate=gate, approvals=standings,
        approve=approve_refusal(plan, gate, actor, standings),
        advance=advance_refusal(plan, gate, actor, standings),
        attest={o.check.pk: attest_refusal(plan, o.check, actor,
                                           standing_attestation(o.check))
                for o in gate.outcomes})
