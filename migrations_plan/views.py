"""Migration plans dashboard: the plan board, the form that opens a plan, and the plan page
(its gate per stage, approvals, the approve/advance decision, gate edits, plan actions and
the timeline).

Function views that call selectors (reads) and services (writes, through the view kit:
`form_action`, `call_service`).
The services decide every permission and rule, through `permissions`; the views show its
answer in advance, so a disabled button carries the reason the service would give. htmx
asks for the gate block of the same page by targeting its id; the view then renders only
that partial.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django import forms
from django.contrib import messages
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from fleetctl.accounts import roles
from fleetctl.accounts.actor import Actor
from fleetctl.accounts.dashboard import dashboard_view
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.views import (
    button_action,
    form_action,
    form_page,
    get_or_404,
)
from migrations_plan import evidence as ev
from migrations_plan import permissions, selectors, services
from migrations_plan.forms import (
    AdvanceForm,
    ApproveForm,
    AttestForm,
    CheckAddForm,
    CheckEditForm,
    PlanForm,
    ReasonForm,
    RegressForm,
    check_edit_initial,
)
from migrations_plan.models import STAGE_NAMES, Attestation, GateCheck, Plan

GATE_ID = "plan-gate"  # the block htmx re-polls
TIMELINE_LIMIT = 200

# A gate's status is its worst check's, in the words the API, the CLI and the metrics use
# (evidence.STATUS_LABELS); this is what it means for the person deciding.
GATE_LABELS = ev.STATUS_LABELS
GATE_MEANING = {
    ev.PASS: "ready to approve",
    ev.WARN: "approvable with a justification",
    ev.INSUFFICIENT: "approvable with a justification",
    ev.AWAITING: f"{ev.BLOCKED_LABEL}: nothing can be approved until the attestation is given",
    ev.FAIL: f"{ev.BLOCKED_LABEL}: nothing can be approved until the failing checks clear",
}

# What each reason box asks.
LABELS = {"pause": "Why pause", "resume": "Why resume", "abandon": "Why abandon",
          "remove": "Why remove this check"}

# Timeline actions in words (the code stays visible beside them).
ACTION_WORDS = {
    "plan.create": "opened the plan",
    "plan.update": "changed the plan's terms",
    "plan.check.add": "added a check",
    "plan.check.update": "changed a check",
    "plan.check.remove": "removed a check",
    "plan.check.status": "check status changed",
    "plan.attest": "attested",
    "plan.approve": "approved the gate",
    "plan.approval.void": "approval voided",
    "plan.advance": "advanced",
    "plan.complete": "completed the plan",
    "plan.regress": "moved back",
    "plan.pause": "paused",
    "plan.resume": "resumed",
    "plan.rehearse": "started a drain rehearsal",
    "plan.abandon": "abandoned",
    "plan.business_case.update": "changed the business case",
    "plan.business_case.judged": "business case judged again",
}


def age_text(since: datetime, now: datetime | None = None) -> str:
    """'3 d 4 h', '5 h 10 min', '12 min': how long, in the two units that matter."""
    seconds = max(((now or timezone.now()) - since).total_seconds(), 0)
    days, rest = divmod(int(seconds), 86400)
    hours, rest = divmod(rest, 3600)
    minutes = rest // 60
    if days:
        return f"{days} d {hours} h"
    if hours:
        return f"{hours} h {minutes} min"
    return f"{minutes} min"


# --- the board -------------------------------------------------------------------------------

COLUMN_PAGE = 30  # cards a page of one column (?column=)
CLOSED_PAGE = 50  # rows a page of closed plans (?closed=1)

@dataclass
class BoardCard:
    plan: Plan
    gate: ev.GateEvaluation | None
    age: str
    approvals: int

    @property
    def passed(self) -> int:
        return self.gate.passed if self.gate else 0

    @property
    def total(self) -> int:
        return len(self.gate.outcomes) if self.gate else 0

    @property
    def percent(self) -> int:
        return round(100 * self.passed / self.total) if self.total else 0

    @property
    def blockers(self) -> list[str]:
        return [o.check.title for o in self.gate.blockers] if self.gate else []

    @property
    def status(self) -> str:
        return self.gate.status if self.gate else ""

    @property
    def label(self) -> str:
        return GATE_LABELS.get(self.status, "")

    @property
    def meaning(self) -> str:
        return "" if ev.blocks_advance(self.status) else GATE_MEANING.get(self.status, "")

    @property
    def blocks_advance(self) -> bool:
        return bool(self.gate) and ev.blocks_advance(self.status)


@dashboard_view
@require_GET
def plan_board(request: HttpRequest) -> HttpResponse:
    """The board: each column's longest-waiting plans (selectors.BOARD_CARDS); with
    ?column=<state>, one column's every open plan a page at a time; ?closed=1 (the board
    only) adds the closed plans, a page at a time."""
    column = request.GET.get("column")
    page = None
    if column:
        label = selectors.column_label(column)
        if label is None:
            raise Http404(f"No board column {column!r}: the columns are "
                          f"{', '.join(state for state, _ in selectors.BOARD_COLUMNS)}.")
        page = Paginator(selectors.plan_column(state=column), COLUMN_PAGE).get_page(
            request.GET.get("page"))
        board = [selectors.BoardColumn(column, label, selectors.column_cards(page.object_list),
                                       page.paginator.count)]
    else:
        board = selectors.plan_board()
    approvals = selectors.counting_approvals(cards=[card for col in board
                                                    for card in col.cards])
    now = timezone.now()
    columns = [
        (col, [BoardCard(plan=c.plan, gate=c.gate, age=age_text(c.plan.stage_entered_at, now),
                         approvals=approvals.get(c.plan.pk, 0)) for c in col.cards])
        for col in board
    ]
    show_closed = request.GET.get("closed") == "1" and not column
    closed = selectors.plans_closed()
    return render(request, "migrations_plan/board.html", {
        "columns": columns,
        "column": board[0] if column else None,
        "page": page,
        "open_count": sum(col.total for col in board),
        "per_column": selectors.BOARD_CARDS,
        "show_closed": show_closed,
        "closed": (Paginator(closed, CLOSED_PAGE).get_page(request.GET.get("page"))
                   if show_closed else None),
        "closed_count": closed.count(),
    })


# --- opening a plan --------------------------------------------------------------------------

@dashboard_view
@require_http_methods(["GET", "POST"])
def plan_create(request: HttpRequest) -> HttpResponseBase:
    form = PlanForm(request.POST if request.method == "POST" else None)
    return form_page(
        request, form, lambda data: services.plan_create(
            actor=actor_from_request(request), **{**data, "routes": list(data["routes"])}),
        success=lambda plan: f"Opened plan {plan.name} at stage 1 (abstraction) with the "
                             f"default gates.",
        then=_plan_url, template="migrations_plan/plan_form.html", flash_refusals=True)


# --- the plan page ---------------------------------------------------------------------------

@dataclass
class CheckRow:
    """One check of the viewed gate, with what the page offers on it."""

    outcome: ev.CheckOutcome
    numbers: list[tuple[str, str]]
    attestation: Attestation | None
    attest_refusal: permissions.Refusal | None  # None: this person may attest it now
    attest_form: AttestForm
    edit_form: CheckEditForm
    remove_form: ReasonForm
    history: list[selectors.HistorySegment]

    @property
    def check(self) -> GateCheck:
        return self.outcome.check

    @property
    def status(self) -> str:
        return self.outcome.status

    @property
    def status_label(self) -> str:
        return ev.status_label(self.outcome.status)

    @property
    def rule_label(self) -> str:
        rule = ev.RULES.get(self.check.rule)
        return rule.description if rule else ""

    @property
    def can_attest(self) -> bool:
        return self.attest_refusal is None

    @property
    def attest_why_not(self) -> str:
        return self.attest_refusal.reason if self.attest_refusal else ""


def _numbers(values: dict[str, Any]) -> list[tuple[str, str]]:
    def show(value: Any) -> str:
        if isinstance(value, dict | list):
            return json.dumps(value, sort_keys=True, default=str)
        return "—" if value is None else str(value)

    return [(key.replace("_", " "), show(value)) for key, value in values.items()]


def _viewed_stage(request: HttpRequest, plan: Plan) -> int:
    try:
        stage = int(request.GET.get("stage") or plan.stage)
    except ValueError:
        return plan.stage
    return stage if stage in STAGE_NAMES else plan.stage


def _check_rows(gate: ev.GateEvaluation, decision: permissions.GateDecision,
                bound: dict[str, forms.Form]) -> list[CheckRow]:
    rows = []
    strips = selectors.history_strips(checks=[o.check for o in gate.outcomes], now=gate.at)
    for outcome in gate.outcomes:
        check = outcome.check
        pk = check.pk
        attestation = permissions.standing_attestation(check)
        attest_form = bound.get(f"attest-{pk}") or AttestForm(prefix=f"attest-{pk}")
        edit_form = bound.get(f"edit-{pk}") or CheckEditForm(
            prefix=f"edit-{pk}", initial=check_edit_initial(check))
        remove_form = bound.get(f"remove-{pk}") or ReasonForm(prefix=f"remove-{pk}",
                                                              label=LABELS["remove"])
        rows.append(CheckRow(
            outcome=outcome, numbers=_numbers(outcome.result.numbers), attestation=attestation,
            attest_refusal=decision.attest.get(pk),
            attest_form=attest_form,  # type: ignore[arg-type]
            edit_form=edit_form,  # type: ignore[arg-type]
            remove_form=remove_form,  # type: ignore[arg-type]
            history=strips.get(pk, []),
        ))
    return rows


def _stage_tabs(plan: Plan, viewed: int) -> list[dict[str, Any]]:
    tabs = []
    for number, name in STAGE_NAMES.items():
        where = ("passed" if number < plan.stage or plan.state == Plan.State.COMPLETED
                 else "current" if number == plan.stage else "ahead")
        tabs.append({"number": number, "name": name, "where": where,
                     "viewed": number == viewed})
    return tabs


def _render_plan(request: HttpRequest, plan: Plan, *, stage: int | None = None,
                 bound: dict[str, forms.Form] | None = None, status: int = 200
                 ) -> HttpResponse:
    """The plan page, or only its gate block for htmx. `bound` holds a submitted form that
    failed, so its errors and what was typed show where it was typed."""
    bound = bound or {}
    actor = actor_from_request(request)
    viewed = stage or _viewed_stage(request, plan)
    is_current = viewed == plan.stage
    gate = ev.evaluate_gate(plan, stage=viewed)
    approvals = selectors.approvals_for_gate(plan=plan, gate=gate)
    decision = permissions.decide(plan, gate, actor, approvals=approvals)
    editable = plan.is_open and viewed >= plan.stage
    context: dict[str, Any] = {
        "plan": plan,
        "gate": gate,
        "gate_label": GATE_LABELS[gate.status] if gate.outcomes else "no checks",
        "gate_meaning": GATE_MEANING.get(gate.status, ""),
        "viewed_stage": viewed,
        "viewed_stage_name": STAGE_NAMES[viewed],
        "is_current": is_current,
        "rows": _check_rows(gate, decision, bound),
        "approvals": approvals,
        "decision": decision,
        "approve_form": bound.get("approve") or ApproveForm(prefix="approve"),
        "advance_form": bound.get("advance") or AdvanceForm(prefix="advance"),
        "editable": editable,
        "min_justification": services.MIN_JUSTIFICATION,
        "polling": plan.is_open,
        "gate_id": GATE_ID,
        "history_days": selectors.HISTORY_DAYS,
    }
    if context["decision"].needs_justification:
        # Said on the form (and enforced by the browser); the service enforces it again.
        context["approve_form"].fields["justification"].required = True
    if request.htmx.target == GATE_ID:  # type: ignore[attr-defined]
        return render(request, "migrations_plan/_gate.html", context, status=status)
    context.update(_page_context(plan, viewed, actor, bound))
    return render(request, "migrations_plan/plan_detail.html", context, status=status)


def _page_context(plan: Plan, viewed: int, actor: Actor, bound: dict[str, forms.Form]
                  ) -> dict[str, Any]:
    """What the whole plan page shows around its gate block: the stage tabs, the plan's
    routes and actions, the add-check form and the timeline."""
    now = timezone.now()
    return {
        "tabs": _stage_tabs(plan, viewed),
        "age": age_text(plan.stage_entered_at, now),
        "overdue": bool(plan.target_date and plan.is_open
                        and plan.target_date < now.date()),
        "routes": list(plan.routes.all()),
        "removed": list(selectors.removed_checks(plan=plan, stage=viewed)),
        "add_form": bound.get("add") or CheckAddForm(prefix="add"),
        "rules": sorted(ev.RULES.values(), key=lambda rule: rule.name),
        "show_actions": plan.is_open and (actor.can(roles.APPROVE) or (
            plan.in_stage and actor.can(roles.DRAIN))),
        "pause_form": bound.get("pause") or ReasonForm(prefix="pause", label=LABELS["pause"]),
        "resume_form": bound.get("resume") or ReasonForm(prefix="resume",
                                                         label=LABELS["resume"]),
        "abandon_form": bound.get("abandon") or ReasonForm(prefix="abandon",
                                                           label=LABELS["abandon"]),
        "regress_form": bound.get("regress") or RegressForm(prefix="regress", plan=plan),
        "timeline": [(event, ACTION_WORDS.get(event.action, event.action))
                     for event in selectors.plan_timeline(plan=plan, limit=TIMELINE_LIMIT)],
        "timeline_limit": TIMELINE_LIMIT,
        "audit_url": f"{reverse('audit:list')}?object_type=migrations_plan.plan"
                     f"&object_id={plan.pk}",
    }


@dashboard_view
@require_GET
def plan_detail(request: HttpRequest, name: str) -> HttpResponse:
    plan = get_or_404(selectors.plan_get, name=name, what=f"plan named {name!r}")
    return _render_plan(request, plan)


# --- writes ----------------------------------------------------------------------------------

def _plan_url(plan: Plan, stage: int | None = None, anchor: str = "") -> str:
    url = reverse("plans:detail", args=[plan.name])
    if stage is not None and stage != plan.stage:
        url += f"?stage={stage}"
    return url + (f"#{anchor}" if anchor else "")


def _act(request: HttpRequest, plan: Plan, *, key: str, form: forms.Form,
         call: Callable[[Actor, dict[str, Any]], Any], success: str,
         stage: int | None = None, anchor: str = "") -> HttpResponseBase:
    """One POST from the plan page: validate the form, call the service, then either go back
    to the page with a message or show the page again with the form's errors (a refusal's
    message is flashed; nothing has changed). Either way the plan is read again: the
    service may have moved it."""

    def fresh() -> Plan:
        return selectors.plan_get(name=plan.name) or plan

    return form_action(
        request, form, lambda data: call(actor_from_request(request), data),
        success=lambda _result: success,
        then=lambda _result: _plan_url(fresh(), stage, anchor),
        invalid=lambda done: _render_plan(request, fresh(), stage=stage, bound={key: form},
                                          status=done.status),
        flash_refusals=True)


@dashboard_view
@require_POST
def plan_approve(request: HttpRequest, name: str) -> HttpResponseBase:
    plan = get_or_404(selectors.plan_get, name=name, what=f"plan named {name!r}")
    return _act(request, plan, key="approve", anchor="approvals",
                form=ApproveForm(request.POST, prefix="approve"),
                call=lambda actor, data: services.approve(
                    actor=actor, plan=plan, justification=data["justification"]),
                success=f"You approved the stage {plan.stage} ({plan.stage_name}) gate of "
                        f"{plan.name}.")


@dashboard_view
@require_POST
def plan_advance(request: HttpRequest, name: str) -> HttpResponseBase:
    plan = get_or_404(selectors.plan_get, name=name, what=f"plan named {name!r}")
    after = "completed" if plan.stage == 4 else (
        f"now at stage {plan.stage + 1} ({STAGE_NAMES.get(plan.stage + 1, '')})")
    return _act(request, plan, key="advance",
                form=AdvanceForm(request.POST, prefix="advance"),
                call=lambda actor, data: services.advance(actor=actor, plan=plan,
                                                          reason=data["reason"]),
                success=f"Plan {plan.name} advanced: {after}.")


def _leave(request: HttpRequest, name: str, kind: str,
           service: Callable[..., Plan]) -> HttpResponseBase:
    plan = get_or_404(selectors.plan_get, name=name, what=f"plan named {name!r}")
    return _act(request, plan, key=kind, anchor="plan-actions",
                form=ReasonForm(request.POST, prefix=kind, label=LABELS[kind]),
                call=lambda actor, data: service(actor=actor, plan=plan,
                                                 reason=data["reason"]),
                success=f"Plan {plan.name} {services.PAST[kind]}.")


@dashboard_view
@require_POST
def plan_pause(request: HttpRequest, name: str) -> HttpResponseBase:
    return _leave(request, name, "pause", services.pause)


@dashboard_view
@require_POST
def plan_resume(request: HttpRequest, name: str) -> HttpResponseBase:
    return _leave(request, name, "resume", services.resume)


@dashboard_view
@require_POST
def plan_abandon(request: HttpRequest, name: str) -> HttpResponseBase:
    return _leave(request, name, "abandon", services.abandon)


@dashboard_view
@require_POST
def plan_rehearse(request: HttpRequest, name: str) -> HttpResponse:
    """Start a drain rehearsal (stage 4) and follow it on its drain page."""
    plan = get_or_404(selectors.plan_get, name=name, what=f"plan named {name!r}")
    return button_action(
        request, lambda: services.rehearsal_start(actor=actor_from_request(request), plan=plan),
        success=lambda _: f"Drain rehearsal started for {plan.name}; the split is restored "
                          f"once every gateway verified and streams closed.",
        then=lambda drain: reverse("traffic:drain-detail", kwargs={"drain_id": drain.pk}),
        back=_plan_url(plan, None, "plan-actions"))


@dashboard_view
@require_POST
def plan_regress(request: HttpRequest, name: str) -> HttpResponseBase:
    plan = get_or_404(selectors.plan_get, name=name, what=f"plan named {name!r}")
    return _act(request, plan, key="regress", anchor="plan-actions",
                form=RegressForm(request.POST, prefix="regress", plan=plan),
                call=lambda actor, data: services.regress(
                    actor=actor, plan=plan, to_stage=data["to_stage"], reason=data["reason"]),
                success=f"Plan {plan.name} moved back.")


@dashboard_view
@require_POST
def check_add(request: HttpRequest, name: str) -> HttpResponseBase:
    plan = get_or_404(selectors.plan_get, name=name, what=f"plan named {name!r}")
    stage = _posted_stage(request)
    if stage is None:
        messages.error(request, "Stages are 1–4; nothing was added.")
        return redirect(_plan_url(plan, anchor="add-check"))
    return _act(request, plan, key="add", stage=stage, anchor="add-check",
                form=CheckAddForm(request.POST, prefix="add"),
                call=lambda actor, data: services.check_add(
                    actor=actor, plan=plan, stage=stage, title=data["title"],
                    rule=data["rule"], params=data["params"], attest_role=data["attest_role"]),
                success=f"Added a check to the stage {stage} gate.")


def _posted_stage(request: HttpRequest) -> int | None:
    try:
        stage = int(request.POST.get("stage", ""))
    except ValueError:
        return None
    return stage if stage in STAGE_NAMES else None


def _on_check(request: HttpRequest, name: str, check_id: int, *, kind: str,
              form: Callable[[str], forms.Form],
              call: Callable[[Actor, GateCheck, dict[str, Any]], Any],
              success: Callable[[GateCheck], str]) -> HttpResponseBase:
    """One POST about one check of a gate: its form is prefixed `<kind>-<check id>`, so its
    errors show on that check's row, and the page goes back to the check's stage."""
    plan = get_or_404(selectors.plan_get, name=name, what=f"plan named {name!r}")
    check = get_or_404(selectors.check_get, plan=plan, check_id=check_id,
                       what=f"check {check_id} in plan {plan.name}")
    prefix = f"{kind}-{check.pk}"
    return _act(request, plan, key=prefix, stage=check.stage, anchor="gate",
                form=form(prefix), call=lambda actor, data: call(actor, check, data),
                success=success(check))


@dashboard_view
@require_POST
def check_edit(request: HttpRequest, name: str, check_id: int) -> HttpResponseBase:
    return _on_check(
        request, name, check_id, kind="edit",
        form=lambda prefix: CheckEditForm(request.POST, prefix=prefix),
        call=lambda actor, check, data: services.check_update(
            actor=actor, check=check, title=data["title"], params=data["params"]),
        success=lambda check: f"Saved check {check.title!r}.")


@dashboard_view
@require_POST
def check_remove(request: HttpRequest, name: str, check_id: int) -> HttpResponseBase:
    return _on_check(
        request, name, check_id, kind="remove",
        form=lambda prefix: ReasonForm(request.POST, prefix=prefix, label=LABELS["remove"]),
        call=lambda actor, check, data: services.check_remove(
            actor=actor, check=check, reason=data["reason"]),
        success=lambda check: f"Removed check {check.title!r} from the stage {check.stage} "
                              f"gate.")


@dashboard_view
@require_POST
def check_attest(request: HttpRequest, name: str, check_id: int) -> HttpResponseBase:
    return _on_check(
        request, name, check_id, kind="attest",
        form=lambda prefix: AttestForm(request.POST, prefix=prefix),
        call=lambda actor, check, data: services.attest(actor=actor, check=check,
                                                        note=data["note"]),
        success=lambda check: f"You attested {check.title!r}.")
