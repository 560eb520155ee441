"""Reads for migration plans: the board, one plan's gate, approvals and timeline."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from django.db.models import Count, F, QuerySet, Window
from django.db.models.functions import RowNumber
from django.utils import timezone

from fleetctl.audit.models import AuditEvent
from fleetctl.audit.selectors import object_history
from migrations_plan import evidence as ev
from migrations_plan import permissions
from migrations_plan.models import (
    STAGE_NAMES,
    Approval,
    CheckStatusChange,
    Evidence,
    GateCheck,
    Plan,
    StageMove,
)

if TYPE_CHECKING:
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic.models import Route


def live_weight_guard(pool: Pool, route: Route) -> str | None:
    """The traffic app's hook, per pool (`live_weight_batch_guard` for one pool)."""
    return live_weight_batch_guard([pool], route).get(pool.pk)


def live_weight_batch_guard(pools: Sequence[Pool], route: Route) -> dict[int, str]:
    """The traffic app's hook, {pool id: reason} for the pools refused, in three reads
    whatever their number: a pool that is the candidate of an open plan below
    stage 4 carries no interactive weight on any route (its plan's or another; a route with no
    latency class counts as interactive). At stage 3 it may carry its plan's batch-class
    routes (batch jobs, backfills, eval sweeps), and nothing else. Paused at any stage: no
    weight. Every open plan of the pool must allow it (stage 4, or completed, lifts the rule).
    A plan abandoned on this route still refuses it there until a new plan takes the route.
    Guards apply to increases only (policy.py): a drain is never blocked."""
    ids = [pool.pk for pool in pools]
    refused: dict[int, str] = {}
    batch = route.latency_class == BATCH_CLASS
    for plan in (Plan.objects.filter(candidate_pool_id__in=ids)
                 .exclude(state__in=Plan.CLOSED_STATES).exclude(state=Plan.State.STAGE_4)
                 .prefetch_related("routes").order_by("-created_at", "-id")):
        if plan.candidate_pool_id not in refused:
            refusal = _stage_refusal(plan, route, batch=batch)
            if refusal:
                refused[plan.candidate_pool_id] = refusal
    if route.pk is None:
        return refused  # a route being created is in no plan yet
    newest: dict[int, Plan] = {}
    for plan in (Plan.objects.filter(candidate_pool_id__in=ids, routes=route)
                 .exclude(candidate_pool_id__in=list(refused))
                 .order_by("-created_at", "-id")):
        newest.setdefault(plan.candidate_pool_id, plan)
    for pool_id, plan in newest.items():
        if plan.state == Plan.State.ABANDONED:
            refused[pool_id] = (f"its migration plan {plan.name} was abandoned; open a new "
                                f"plan to give it live traffic")
    return refused


BATCH_CLASS = "batch"


def plan_batch_routes(plan: Plan) -> list[Route]:
    """The plan's batch-latency-class routes: what its candidate may carry at stage 3."""
    return [r for r in plan.routes.all() if r.latency_class == BATCH_CLASS]


def _stage_refusal(plan: Plan, route: Route, *, batch: bool) -> str | None:
    """Why `plan` (open, below stage 4 or paused) keeps its candidate off `route`, or None."""
    batch_routes = plan_batch_routes(plan)
    named = ", ".join(r.name for r in batch_routes) or "it lists none"
    stage3 = (f"stage 3 (batch) only on the plan's batch-class routes ({named})")
    if plan.state == Plan.State.PAUSED:
        return (f"its migration plan {plan.name} is paused at stage {plan.stage}; live weight "
                f"needs stage 4 (live) on any route, {stage3}; resume the plan first")
    if plan.stage < 3:
        return (f"candidate of plan {plan.name}, which is at stage {plan.stage} "
                f"({STAGE_NAMES[plan.stage]}); live weight needs stage 4 (live) on any route, "
                f"{stage3}")
    if not batch:
        return (f"candidate of plan {plan.name}, which is at stage 3 (batch); live weight "
                f"needs stage 4 (live) on any interactive route (route {route.name} is "
                f"{route.latency_class or 'of any latency class, so interactive'}); at "
                f"stage 3 it carries only the plan's batch-class routes ({named})")
    if route.pk is None or route.pk not in {r.pk for r in batch_routes}:
        return (f"candidate of plan {plan.name}, which is at stage 3 (batch); it carries "
                f"only the plan's batch-class routes ({named}), and {route.name} is not one "
                f"of them: add the route to a plan, or wait for stage 4 (live)")
    return None


def plan_list() -> QuerySet[Plan]:
    return (Plan.objects.select_related("candidate_pool__region", "primary_pool", "owner",
                                        "created_by")
            .prefetch_related("routes"))


def plan_get(*, name: str) -> Plan | None:
    return plan_list().filter(name=name).first()


@dataclass
class PlanCard:
    plan: Plan
    gate: ev.GateEvaluation | None

    @property
    def age_days(self) -> float:
        return (timezone.now() - self.plan.stage_entered_at).total_seconds() / 86400

    @property
    def progress(self) -> tuple[int, int]:
        if self.gate is None:
            return (0, 0)
        return (self.gate.passed, len(self.gate.outcomes))


BOARD_COLUMNS = [("stage-1", "1 · abstraction"), ("stage-2", "2 · shadow"),
                 ("stage-3", "3 · batch"), ("stage-4", "4 · live"), ("paused", "paused")]


# Cards a board column shows: the plans longest in their stage first. A gate is evaluated
# live for each card shown (~11 ms a plan at 1,000 pools, benchmarks/scale_rehearsal.py), so
# the board's cost is bounded by this, not by how many plans are open; the rest of a column
# is one link away (`plan_column`).
BOARD_CARDS = 8


@dataclass
class BoardColumn:
    state: str
    label: str
    cards: list[PlanCard]
    total: int  # open plans in this column; more than len(cards) when capped

    @property
    def more(self) -> int:
        return self.total - len(self.cards)


def plan_column(*, state: str) -> QuerySet[Plan]:
    """Every open plan of one board column (`state` one of BOARD_COLUMNS'), longest in its
    stage first: the board shows the first few, the column's own page all of them (cards
    made with `column_cards`)."""
    return plan_list().filter(state=state).order_by("stage_entered_at", "id")


def _card(plan: Plan) -> PlanCard:
    return PlanCard(plan=plan, gate=ev.evaluate_gate(plan) if plan.in_stage else None)


def plan_board(*, per_column: int | None = None) -> list[BoardColumn]:
    """Columns per stage (and paused): each the `per_column` (BOARD_CARDS) open plans longest
    in their stage, a card each with its gate evaluated now, and how many the column holds."""
    per_column = per_column or BOARD_CARDS
    totals = dict(Plan.objects.exclude(state__in=Plan.CLOSED_STATES).order_by()
                  .values("state").annotate(n=Count("id")).values_list("state", "n"))
    return [BoardColumn(state, label,
                        column_cards(plan_column(state=state)[:per_column]) if totals.get(state)
                        else [], totals.get(state, 0))
            for state, label in BOARD_COLUMNS]


def column_label(state: str) -> str | None:
    return dict(BOARD_COLUMNS).get(state)


def column_cards(plans: Iterable[Plan]) -> list[PlanCard]:
    return [_card(p) for p in plans]


def approvals_for_gate(*, plan: Plan, gate: ev.GateEvaluation
                       ) -> list[permissions.ApprovalStanding]:
    """The gate's stage's approvals, each marked whether it still counts on this evidence."""
    return permissions.stage_approvals(plan, gate)


def plan_checks(*, plan: Plan, include_removed: bool = True) -> QuerySet[GateCheck]:
    rows = plan.checks.all().prefetch_related("attestations__by")
    if not include_removed:
        rows = rows.filter(removed_at__isnull=True)
    return rows.order_by("stage", "position", "id")


def plan_timeline(*, plan: Plan, limit: int = 200) -> list[AuditEvent]:
    """Everything that happened to the plan, newest first: edits, attestations, approvals
    (and refusals), voids, evidence status changes, stage moves."""
    return object_history(object_type="migrations_plan.plan", object_id=plan.pk, limit=limit)


def plan_approvals(*, plan: Plan) -> QuerySet[Approval]:
    """Every approval of every stage, newest first, with who gave it."""
    return plan.approvals.select_related("by").order_by("-at", "-id")


def plan_moves(*, plan: Plan) -> QuerySet[StageMove]:
    """Every stage move, newest first, with the approvals it used and the drains it ran."""
    return plan.moves.prefetch_related("approvals__by", "drains").order_by("-at", "-id")


def evidence_list() -> QuerySet[Evidence]:
    return Evidence.objects.select_related("pool", "route")


def plan_evidence(*, plan: Plan, kinds: Sequence[str] | None = None,
                  other_than: Sequence[str] = ()) -> list[Evidence]:
    """Evidence rows about the plan's candidate and primary (of `kinds`, or of any kind but
    `other_than`), oldest first (time, then id): what the migration report writes down."""
    rows = evidence_list().filter(pool__in=[plan.candidate_pool_id, plan.primary_pool_id])
    if kinds is not None:
        rows = rows.filter(kind__in=list(kinds))
    return list(rows.exclude(kind__in=list(other_than)).order_by("observed_at", "id"))


def gate_summary(gate: ev.GateEvaluation) -> dict[str, Any]:
    return {"stage": gate.stage, "status": gate.status,
            "status_label": ev.status_label(gate.status),
            "blocks_advance": gate.blocks_advance, "passed": gate.passed,
            "total": len(gate.outcomes),
            "blockers": [o.check.title for o in gate.blockers]}


def open_plans() -> QuerySet[Plan]:
    return Plan.objects.exclude(state__in=Plan.CLOSED_STATES)


# --- reads for the dashboard ------------------------------------------------------------------

def plans_closed() -> QuerySet[Plan]:
    """Completed and abandoned plans, most recently closed first."""
    return plan_list().filter(state__in=Plan.CLOSED_STATES).order_by("-closed_at", "-id")


def counting_approvals(*, cards: list[PlanCard]) -> dict[int, int]:
    """Per plan, the approvals of its current stage that still count on the gate its card
    shows (one query for the whole board)."""
    from django.db.models import F

    gates = {card.plan.pk: card.gate for card in cards if card.gate is not None}
    active: dict[int, list[Approval]] = {}
    for approval in Approval.objects.filter(plan__in=list(gates), stage=F("plan__stage"),
                                            voided_at__isnull=True, used_at__isnull=True):
        active.setdefault(approval.plan_id, []).append(approval)
    return {plan_id: sum(1 for s in permissions.approval_standings(approvals, gates[plan_id])
                         if s.counts)
            for plan_id, approvals in active.items()}


def check_list() -> QuerySet[GateCheck]:
    return GateCheck.objects.select_related("plan")


def check_get(*, plan: Plan, check_id: int) -> GateCheck | None:
    return check_list().filter(plan=plan, pk=check_id).first()


def check_as_listed(*, check: GateCheck) -> GateCheck:
    """A check as the plan's check list shows it (with its attestations), read again after
    a write changed it."""
    return plan_checks(plan=check.plan).get(pk=check.pk)


def removed_checks(*, plan: Plan, stage: int) -> QuerySet[GateCheck]:
    return plan.checks.filter(stage=stage, removed_at__isnull=False).order_by("-removed_at")


# --- a check's history ------------------------------------------------------------------------

HISTORY_LIMIT = 50  # rows of one check's history the API gives, newest first
HISTORY_DAYS = 14  # days the gate page's strip covers


def check_history(*, check: GateCheck, limit: int | None = None) -> list[CheckStatusChange]:
    """One check's status changes, newest first, at most `limit` (default HISTORY_LIMIT)."""
    return list(CheckStatusChange.objects.filter(check_item=check)
                .order_by("-at", "-id")[:limit or HISTORY_LIMIT])


@dataclass(frozen=True)
class HistorySegment:
    """One stretch of a check's history strip: a status from `start` to `end`, as a share
    of the strip's width."""

    status: str
    start: datetime
    end: datetime
    percent: float
    summary: str

    @property
    def label(self) -> str:
        return ev.status_label(self.status)

    @property
    def css(self) -> str:
        return "pending" if self.status == "awaiting-attestation" else self.status

    @property
    def hover(self) -> str:
        text = (f"{self.label} from {self.start:%Y-%m-%d %H:%M} to "
                f"{self.end:%Y-%m-%d %H:%M} UTC")
        return f"{text}: {self.summary}" if self.summary else text


def history_strips(*, checks: list[GateCheck], days: int = HISTORY_DAYS,
                   now: datetime | None = None) -> dict[int, list[HistorySegment]]:
    """Per check id, its statuses over the last `days` days as segments, oldest first: the
    status it had when the window opened (its last change before), then each change. Time
    before its first known status is a segment of status "unknown". Two queries in all."""
    now = now or timezone.now()
    start = now - timedelta(days=days)
    ids = [check.pk for check in checks]
    span = (now - start).total_seconds()
    # Each check's last change before the window: ranked per check by the database (a window
    # function, on PostgreSQL and SQLite alike; DISTINCT ON is PostgreSQL's only).
    before = {row.check_item_id: row for row in CheckStatusChange.objects
              .filter(check_item_id__in=ids, at__lt=start)
              .annotate(rank=Window(RowNumber(), partition_by=[F("check_item_id")],
                                    order_by=[F("at").desc(), F("id").desc()]))
              .filter(rank=1)}
    inside: dict[int, list[CheckStatusChange]] = {pk: [] for pk in ids}
    for row in (CheckStatusChange.objects.filter(check_item_id__in=ids, at__gte=start,
                                                 at__lte=now).order_by("at", "id")):
        inside[row.check_item_id].append(row)
    strips: dict[int, list[HistorySegment]] = {}
    for pk in ids:
        points: list[tuple[datetime, str, str]] = []
        first = before.get(pk)
        points.append((start, first.status, first.summary) if first
                      else (start, "unknown", "no status recorded yet"))
        points += [(row.at, row.status, row.summary) for row in inside[pk]]
        segments = []
        for i, (at, status, summary) in enumerate(points):
            end = points[i + 1][0] if i + 1 < len(points) else now
            if end <= at and i + 1 < len(points):
                continue  # superseded at the same instant
            segments.append(HistorySegment(
                status=status, start=at, end=end, summary=summary,
                percent=round(max(0.0, (end - at).total_seconds()) / span * 100, 3)))
        strips[pk] = segments
    return strips
