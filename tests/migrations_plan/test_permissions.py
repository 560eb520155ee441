"""The one answer to "what may this person do with this gate, and why not"
(`migrations_plan.permissions`), and that the plan page, the API and the services agree on it:
a button the page enables is one the service accepts; a disabled one shows the reason whose
error the service then raises; an approval the API says counts is one the stage move uses."""

from __future__ import annotations

import html
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal, token_create_service
from fleetctl.core.errors import DomainError, PermissionDeniedError
from migrations_plan import evidence as ev
from migrations_plan import permissions as perm
from migrations_plan import services
from migrations_plan.models import Approval, GateCheck, Plan, StageMove
from tests.migrations_plan.helpers import walk_to

PROBE = Actor.for_system("conformance-probe")

JUSTIFICATION = "conformance and cost signed off by hand"
ROLE_NOTE = "Approving and advancing need the <code>platform-lead</code> role"


def fresh(plan: Plan) -> Plan:
    return Plan.objects.select_related("candidate_pool", "primary_pool").get(pk=plan.pk)


def decide(world, plan: Plan, who: str | Actor, stage: int | None = None) -> perm.GateDecision:
    actor = who if isinstance(who, Actor) else world.actor(who)
    plan = fresh(plan)
    return perm.decide(plan, ev.evaluate_gate(plan, stage=stage), actor)


def conformance(world, verdict: str, summary: str, **extra: Any) -> None:
    services.evidence_record(actor=PROBE, pool=world.candidate,
                             kind="conformance", verdict=verdict, summary=summary, **extra)


# --- who may approve and advance --------------------------------------------------------------

def test_the_author_and_the_owner_may_neither_approve_nor_advance(world):
    plan = world.plan(owner=world.lead2)
    services.approve(actor=world.actor("lead"), plan=plan, justification=JUSTIFICATION)
    for who, code, words in (("author", perm.AUTHOR, "opened"), ("lead2", perm.OWNER, "own")):
        decision = decide(world, plan, who)
        assert (decision.approve.code, decision.advance.code) == (code, code)
        assert decision.approve.reason == (f"You {words} this plan; another platform lead "
                                           f"must approve its gates.")
        assert decision.advance.message == (f"You {words} plan mi300x-llama; separation of "
                                            f"duties: another platform lead must advance it.")
        assert decision.approve.error is decision.advance.error is PermissionDeniedError
    # The approver's own approval counts; another lead may still add theirs or advance.
    assert decide(world, plan, "lead").approve.code == perm.ALREADY_APPROVED
    assert decide(world, plan, "lead").advance is None
    assert decide(world, plan, "admin").approve is None


@pytest.mark.parametrize("who", ["viewer", "oncall"])
def test_a_viewer_and_an_on_call_may_neither_approve_nor_advance(world, who):
    plan = world.plan()
    services.approve(actor=world.actor("lead"), plan=plan, justification=JUSTIFICATION)
    decision = decide(world, plan, who)
    assert decision.role_missing
    assert decision.approve.code == decision.advance.code == perm.ROLE
    assert "'plan.approve' needs a role that grants it" in decision.advance.message
    with pytest.raises(PermissionDeniedError, match=re.escape(decision.advance.message)):
        services.advance(actor=world.actor(who), plan=plan, reason="ship it")
    assert Plan.objects.get(pk=plan.pk).state == "stage-1"


def test_tokens_never_approve_or_attest(world, system):
    plan = world.plan()
    personal = token_create_personal(actor=world.actor("lead"), name="cli",
                                     scopes=["read", "jobs"]).token
    service = token_create_service(actor=system, name="bot", scopes=["read", "jobs"]).token
    check = services.check_add(actor=world.actor("lead"), plan=plan, stage=1,
                               title="Runbook reviewed", attest_role="platform-lead")
    as_token = decide(world, plan, Actor(user=world.lead, token=personal))
    assert as_token.approve.code == perm.ROLE
    assert "cannot be done with an API token" in as_token.approve.message
    assert as_token.attest[check.pk].code == perm.TOKEN
    as_service = decide(world, plan, Actor(token=service))
    assert as_service.attest[check.pk].code == perm.PERSON
    assert as_service.attest[check.pk].message == ("Attesting needs a named person; "
                                                  "service:bot is not one.")


def test_a_plan_not_at_a_stage_takes_no_approval_and_other_stages_are_not_decided_here(world):
    plan = world.plan()
    assert decide(world, plan, "lead", stage=2).approve.code == perm.OTHER_STAGE
    services.pause(actor=world.actor("oncall"), plan=plan, reason="capacity review")
    paused = decide(world, plan, "lead")
    assert (paused.approve.code, paused.advance.code) == (perm.PAUSED, perm.PAUSED)
    assert paused.approve.reason == "Plan is paused at stage 1; resume it first."
    assert paused.approve.message == "Plan mi300x-llama is paused; resume it first."
    services.resume(actor=world.actor("lead"), plan=plan, reason="review done")
    services.abandon(actor=world.actor("lead"), plan=plan, reason="the pool is retired")
    closed = decide(world, plan, "lead")
    assert closed.approve.code == closed.advance.code == perm.CLOSED
    assert closed.advance.message == ("Plan mi300x-llama is abandoned; a closed plan cannot "
                                      "be changed.")


def test_a_blocked_gate_and_a_missing_justification(world):
    plan = world.plan()
    decision = decide(world, plan, "lead")
    # Insufficient data: the button is live, the form asks for a justification.
    assert decision.approve is None
    assert [o.check.key for o in decision.needs_justification] == [
        "conformance", "cost-reported", "healthy", "same-revision"]
    gate = ev.evaluate_gate(fresh(plan))
    short = perm.approve_refusal(fresh(plan), gate, world.actor("lead"), [],
                                 justification="ok")
    assert (short.code, short.error, short.field) == (perm.JUSTIFICATION, ValidationError,
                                                      "justification")
    assert perm.approve_refusal(fresh(plan), gate, world.actor("lead"), [],
                                justification=JUSTIFICATION) is None
    conformance(world, "fail", "3 of 40 contract cases fail")
    blocked = decide(world, plan, "lead")
    assert blocked.approve.reason == ("Blocked by: Passes the OpenAI-contract conformance "
                                      "probe (fail).")
    assert blocked.approve.message == ("The stage 1 gate cannot be approved: Passes the "
                                       "OpenAI-contract conformance probe — 3 of 40 contract "
                                       "cases fail")
    assert blocked.advance.message.startswith("Stage 1 gate blocks: ")


# --- whether an approval still counts ---------------------------------------------------------

def test_an_approval_stops_counting_as_soon_as_its_evidence_changes(world, client):
    plan = world.plan(required_approvals=1)
    services.approve(actor=world.actor("lead"), plan=plan, justification=JUSTIFICATION)
    [standing] = decide(world, plan, "lead2").approvals
    assert standing.counts and standing.why_not is None
    conformance(world, "pass", "42/42 contract probes pass")
    # Nothing voided it yet (no refresh, no service call): it no longer counts all the same.
    assert Approval.objects.get().voided_at is None
    decision = decide(world, plan, "lead2")
    [standing] = decision.approvals
    assert not standing.counts
    assert standing.stale_reason == standing.why_not == (
        "check 'Passes the OpenAI-contract conformance probe' went from insufficient data "
        "to pass")
    assert decision.counting == 0 and decision.advance.code == perm.APPROVALS
    assert decide(world, plan, "lead").approve is None  # bob may approve the new evidence
    # The board counts what the plan page counts.
    client.force_login(world.viewer)
    assert "approvals 0 of 1" in client.get(reverse("plans:board")).content.decode()


def test_an_approval_stops_counting_when_what_it_saw_expires(world):
    plan = world.plan()
    conformance(world, "pass", "40/40 cases", ttl_hours=1)
    services.approve(actor=world.actor("lead"), plan=plan, justification=JUSTIFICATION)
    later = ev.evaluate_gate(fresh(plan), now=timezone.now() + timedelta(hours=2))
    [standing] = perm.approval_standings(Approval.objects.all(), later)
    assert not standing.counts and "expired at" in (standing.why_not or "")


def test_voided_and_used_approvals_say_why_they_no_longer_count(world):
    plan = walk_to(world, world.plan(), 2)
    used = Approval.objects.get(stage=1)
    gate1 = ev.evaluate_gate(fresh(plan), stage=1)
    [standing] = perm.approval_standings([used], gate1)
    assert standing.why_not == f"used by the stage move at {used.used_at:%Y-%m-%d %H:%M} UTC"
    assert standing.stale_reason is None
    services.attest(actor=world.actor("lead2"), check=plan.checks.get(stage=2, key="dashboards"),
                    note="boards and alerts exist")
    services.approve(actor=world.actor("lead"), plan=plan, justification=JUSTIFICATION)
    services.regress(actor=world.actor("lead"), plan=plan, to_stage=1, reason="regressed")
    [voided] = perm.approval_standings(Approval.objects.filter(stage=2),
                                       ev.evaluate_gate(fresh(plan), stage=2))
    assert voided.why_not == "voided: plan regressed: regressed"
    [other] = perm.approval_standings([used], ev.evaluate_gate(fresh(plan), stage=2))
    assert other.why_not and other.why_not.startswith("used by")


# --- who may attest ---------------------------------------------------------------------------

def test_who_may_attest_which_check_and_when(world):
    plan = world.plan()
    incident = services.check_add(actor=world.actor("lead"), plan=plan, stage=1,
                                  title="Runbook rehearsed", attest_role="on-call")
    conformance_check = plan.checks.get(stage=1, key="conformance")
    assert decide(world, plan, "oncall").attest[incident.pk] is None
    assert decide(world, plan, "admin").attest[incident.pk] is None
    refused = decide(world, plan, "lead").attest[incident.pk]
    assert refused.code == perm.ATTEST_ROLE
    assert refused.reason == "Only a on-call (or an admin) can attest this."
    assert refused.message == ("Check 'Runbook rehearsed' is attested by a on-call; you have "
                               "platform-lead.")
    assert decide(world, plan, "oncall").attest[conformance_check.pk].code == \
        perm.EVIDENCE_BACKED
    services.attest(actor=world.actor("oncall"), check=incident, note="ran it on Tuesday")
    again = decide(world, plan, "admin").attest[incident.pk]
    assert again.code == perm.ALREADY_ATTESTED and again.message.startswith(
        "Already attested by olga at ")
    # A passed stage's gate is part of the record; a removed check takes no attestation.
    later = services.check_add(actor=world.actor("lead"), plan=plan, stage=2,
                               title="Capacity signed off", attest_role="on-call")
    services.check_remove(actor=world.actor("lead"), check=later, reason="merged into QA")
    removed = perm.attest_refusal(fresh(plan), GateCheck.objects.get(pk=later.pk),
                                  world.actor("oncall"), None)
    assert removed.code == perm.REMOVED
    walk_to(world, plan, 2)
    assert decide(world, plan, "oncall", stage=1).attest[incident.pk].code == perm.BEHIND


# --- the page, the API and the services agree -------------------------------------------------

class _Undo(Exception):
    pass


@contextmanager
def undone() -> Iterator[None]:
    """Run a service call for real, then roll it back, so every person tries the same plan."""
    try:
        with transaction.atomic():
            yield
            raise _Undo
    except _Undo:
        pass


def attempt(call: Callable[[], Any]) -> DomainError | ValidationError | None:
    try:
        call()
    except (DomainError, ValidationError) as exc:
        return exc
    return None


def error_text(exc: DomainError | ValidationError) -> str:
    return exc.message if isinstance(exc, DomainError) else "; ".join(exc.messages)


def page_says(page: str, plan: Plan, action: str) -> str | None:
    """None when the page's button is enabled, else the reason it shows ("role" when the
    page offers no decision at all)."""
    if ROLE_NOTE in page:
        return "role"
    form = page.split(f'action="{reverse(f"plans:{action}", args=[plan.name])}"')[1]
    form = form[:form.index("</form>")]
    if "<fieldset disabled>" not in form:
        return None
    found = re.search(rf'<strong>Cannot {action}:</strong> (.*?)</p>', form, re.S)
    assert found, form
    return html.unescape(found.group(1))


def check_row(page: str, check: GateCheck) -> str:
    row = page[page.index(f'id="check-{check.pk}"'):]
    ends = [row.find(mark) for mark in ('<tr class="check-row', "</tbody>")]
    return row[:min(end for end in ends if end != -1)]


def _fresh_plan(world) -> Plan:
    plan = world.plan(owner=world.lead2)
    services.check_add(actor=world.actor("lead"), plan=plan, stage=2,
                       title="Runbook rehearsed", attest_role="on-call")
    return plan


def _approved(world) -> Plan:
    plan = _fresh_plan(world)
    services.approve(actor=world.actor("lead"), plan=plan, justification=JUSTIFICATION)
    return plan


def _stale(world) -> Plan:
    plan = _approved(world)
    conformance(world, "pass", "42/42 contract probes pass")
    return plan


def _blocked(world) -> Plan:
    plan = _fresh_plan(world)
    conformance(world, "fail", "tool calls come back as plain text")
    return plan


def _attesting(world) -> Plan:
    plan = _fresh_plan(world)
    for role in ("on-call", "platform-lead"):
        services.check_add(actor=world.actor("lead"), plan=plan, stage=1,
                           title=f"Signed off by a {role}", attest_role=role)
    services.attest(actor=world.actor("admin"), check=plan.checks.get(
        stage=1, attest_role="platform-lead"), note="done by the admin")
    return plan


def _paused(world) -> Plan:
    plan = _approved(world)
    services.pause(actor=world.actor("oncall"), plan=plan, reason="capacity review")
    return plan


def _abandoned(world) -> Plan:
    plan = _fresh_plan(world)
    services.abandon(actor=world.actor("lead"), plan=plan, reason="the pool is retired")
    return plan


SCENARIOS = {"fresh": _fresh_plan, "approved": _approved, "stale": _stale,
             "blocked": _blocked, "attesting": _attesting, "paused": _paused,
             "abandoned": _abandoned}
PEOPLE = ["author", "lead2", "lead", "admin", "oncall", "viewer"]  # lead2 owns the plan


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_the_page_the_api_and_the_services_agree_for_every_person(world, scenario):
    plan = fresh(SCENARIOS[scenario](world))
    tried: dict[str, int] = {"allowed": 0, "refused": 0}

    def agree(shown: str | None, refusal: perm.Refusal | None,
              call: Callable[[], Any]) -> None:
        with undone():
            exc = attempt(call)
            if refusal is None:
                assert shown is None and exc is None, (shown, exc)
                tried["allowed"] += 1
                return
            assert shown == ("role" if refusal.code == perm.ROLE else refusal.reason)
            assert exc is not None and isinstance(exc, refusal.error), (refusal, exc)
            assert error_text(exc) == refusal.message
            tried["refused"] += 1

    for who in PEOPLE:
        client = Client()
        client.force_login(getattr(world, who))
        actor = world.actor(who)
        for stage in (1, 2):
            response = client.get(reverse("plans:detail", args=[plan.name]), {"stage": stage})
            page = response.content.decode()
            decision = decide(world, plan, who, stage=stage)
            if stage == plan.stage:
                agree(page_says(page, plan, "approve"), decision.approve,
                      lambda a=actor: services.approve(actor=a, plan=fresh(plan),
                                                       justification=JUSTIFICATION))
                agree(page_says(page, plan, "advance"), decision.advance,
                      lambda a=actor: services.advance(actor=a, plan=fresh(plan), reason="go"))
            for outcome in decision.gate.outcomes:
                check = outcome.check
                if check.kind != GateCheck.Kind.ATTESTED:
                    continue
                row = check_row(page, check)
                refusal = decision.attest[check.pk]
                form = f'name="attest-{check.pk}-note"' in row
                assert form == (refusal is None), (who, check.title, refusal)
                with undone():
                    exc = attempt(lambda a=actor, c=check: services.attest(
                        actor=a, check=GateCheck.objects.get(pk=c.pk),
                        note="confirmed on the page"))
                    if refusal is None:
                        assert exc is None, exc
                        continue
                    assert isinstance(exc, refusal.error) and error_text(exc) == \
                        refusal.message, (refusal, exc)
                if plan.is_open and stage >= plan.stage and 'class="attestation' not in row:
                    assert html.escape(refusal.reason) in row, (refusal.reason, row)

    # The API's approvals: what counts is what the move uses; what does not says the reason
    # the service records when it voids it.
    api = APIClient()
    api.force_login(world.viewer)
    shown = api.get(f"/api/v1/plans/{plan.name}/").json()["approvals"]
    with undone():
        exc = attempt(lambda: services.advance(actor=world.actor("admin"), plan=fresh(plan),
                                               reason="gate approved"))
        if exc is None:
            move = StageMove.objects.get(plan=plan, kind__in=["advance", "complete"])
            assert {a.pk for a in move.approvals.all()} == {a["id"] for a in shown
                                                            if a["counts"]}
        for row in shown:
            approval = Approval.objects.get(pk=row["id"])
            assert row["counts"] == (row["why_not"] is None)
            if not row["counts"] and approval.voided_at is not None and plan.in_stage:
                reason = row["why_not"].removeprefix("voided: ")
                assert approval.void_reason == reason
                assert f"Voided: {approval.by.username} — {reason}." in error_text(exc)
    assert sum(tried.values()) == 2 * len(PEOPLE)  # everyone tried both buttons
