"""Each gate check keeps a history of its statuses (issue 27, "each check has a history (green
and red over the days)"): the plan refresh writes a row for a check's first status and each
change; the gate page draws the last days as a strip of coloured segments with hover text;
`GET /api/v1/plans/<name>/` gives each check's history, newest first, bounded. Time moves by
passing `now=` to the refresh, never by sleeping."""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterable
from datetime import datetime, timedelta

import pytest
from django.apps import apps as django_apps
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from fleetctl.accounts.actor import Actor
from migrations_plan import selectors, services
from migrations_plan.models import CheckStatusChange, GateCheck, Plan

pytestmark = pytest.mark.django_db

PROBE = Actor.for_system("conformance-probe")


def conformance(world, verdict: str, summary: str) -> None:
    services.evidence_record(actor=PROBE, pool=world.candidate, kind="conformance",
                             verdict=verdict, summary=summary)


PASS_THEN_FAIL = ((1, "pass", "40/40 cases"), (2, "fail", "tool calls broken"))


@pytest.fixture
def refreshed(world) -> tuple[Plan, datetime]:
    """A plan refreshed once at t0 (each live check of its gate has its first status), and t0."""
    plan = world.plan()
    t0 = timezone.now()
    services.plan_refresh(plan=plan, now=t0)
    return plan, t0


def conformance_changes(world, plan: Plan, t0: datetime,
                        changes: Iterable[tuple[int, str, str]]) -> None:
    """Per (days, verdict, summary): the probe records the verdict, then the plan refreshes at
    t0 + days."""
    for days, verdict, summary in changes:
        conformance(world, verdict, summary)
        services.plan_refresh(plan=plan, now=t0 + timedelta(days=days))


def history(check: GateCheck) -> list[tuple[str, str]]:
    return [(row.status, row.summary) for row in
            CheckStatusChange.objects.filter(check_item=check).order_by("at", "id")]


def test_the_refresh_writes_the_first_status_and_each_change_only(world, refreshed):
    plan, t0 = refreshed
    check = plan.checks.get(stage=1, key="conformance")
    assert [status for status, _ in history(check)] == ["insufficient"]
    # Every live check of the current gate has its first status.
    assert CheckStatusChange.objects.filter(check_item__plan=plan).count() == \
        plan.checks.filter(stage=1, removed_at__isnull=True).count()
    services.plan_refresh(plan=plan, now=t0 + timedelta(hours=1))  # nothing changed
    assert len(history(check)) == 1
    conformance_changes(world, plan, t0, PASS_THEN_FAIL)
    assert history(check)[1:] == [("pass", "40/40 cases"), ("fail", "tool calls broken")]
    ats = list(CheckStatusChange.objects.filter(check_item=check).order_by("at")
               .values_list("at", flat=True))
    assert ats == [t0, t0 + timedelta(days=1), t0 + timedelta(days=2)]


def test_the_strip_covers_the_last_days_in_segments_with_hover_text(world, refreshed):
    plan, t0 = refreshed
    conformance_changes(world, plan, t0, ((3, "pass", "40/40 cases"),
                                          (10, "fail", "tool calls broken")))
    check = plan.checks.get(stage=1, key="conformance")
    now = t0 + timedelta(days=14)
    strip = selectors.history_strips(checks=[check], days=14, now=now)[check.pk]
    # Before t0 nothing was known; then 3 days insufficient, 7 days pass, 4 days fail.
    assert [seg.status for seg in strip] == ["insufficient", "pass", "fail"]
    assert [round(seg.percent, 1) for seg in strip] == [21.4, 50.0, 28.6]
    assert strip[2].hover.startswith(f"fail from {(t0 + timedelta(days=10)):%Y-%m-%d %H:%M}")
    assert strip[2].hover.endswith("UTC: tool calls broken")
    # A window opening before the first status starts with "unknown".
    early = selectors.history_strips(checks=[check], days=14, now=t0 + timedelta(days=7))
    assert [seg.status for seg in early[check.pk]] == ["unknown", "insufficient", "pass"]
    assert sum(seg.percent for seg in early[check.pk]) == pytest.approx(100, abs=0.01)


def test_the_gate_page_shows_each_checks_strip(world):
    plan = world.plan()
    check = plan.checks.get(stage=1, key="conformance")
    t0 = timezone.now() - timedelta(days=5)
    CheckStatusChange.objects.create(check_item=check, status="insufficient", at=t0,
                                     summary="no probe yet")
    CheckStatusChange.objects.create(check_item=check, status="fail", at=t0 + timedelta(days=2),
                                     summary="tool calls broken")
    client = Client()
    client.force_login(world.lead)
    html = client.get(reverse("plans:detail", args=[plan.name])).content.decode()
    row = html[html.index(f'id="check-{check.pk}"'):]
    row = row[:row.index("</tr>")]
    assert 'class="check-history"' in row
    segments = re.findall(r'class="history-seg history-(\w+)" style="width: ([\d.]+)%" '
                          r'title="([^"]+)"', row)
    assert [s[0] for s in segments] == ["unknown", "insufficient", "fail"]
    assert "tool calls broken" in segments[2][2]
    assert "Status over the last 14 days" in row


def test_the_api_gives_each_checks_history_newest_first_and_bounded(world, refreshed,
                                                                     monkeypatch):
    plan, t0 = refreshed
    conformance_changes(world, plan, t0, PASS_THEN_FAIL[:1])
    client = APIClient()
    client.force_login(world.viewer)
    body = client.get(f"/api/v1/plans/{plan.name}/").json()
    checks = {c["key"]: c for c in body["gate"]["checks"]}
    assert [(h["status"], h["summary"]) for h in checks["conformance"]["history"]] == [
        ("pass", "40/40 cases"),
        ("insufficient", checks["conformance"]["history"][1]["summary"])]
    assert checks["conformance"]["history"][0]["status_label"] == "pass"
    monkeypatch.setattr(selectors, "HISTORY_LIMIT", 1)
    body = client.get(f"/api/v1/plans/{plan.name}/").json()
    checks = {c["key"]: c for c in body["gate"]["checks"]}
    assert [h["status"] for h in checks["conformance"]["history"]] == ["pass"]


MIGRATION = importlib.import_module("migrations_plan.migrations.0010_check_history")


def test_migration_0010_backfills_history_from_the_audit_log(world, refreshed):
    plan, t0 = refreshed
    conformance_changes(world, plan, t0, PASS_THEN_FAIL)
    check = plan.checks.get(stage=1, key="conformance")
    CheckStatusChange.objects.all().delete()  # as before 0010
    MIGRATION.backfill(django_apps, None)
    # The audit log has the two changes (not the first look, which was never audited).
    assert history(check) == [("pass", "40/40 cases"), ("fail", "tool calls broken")]
    # A check with no audited change gets its last status.
    healthy = plan.checks.get(stage=1, key="only-through-route")
    assert [s for s, _ in history(healthy)] == [healthy.last_status]
