"""The stage-3 pages: the plan page's Batch panel (soak, drill, cost arbitrage, "Start a
soak" for people with `jobs` while the plan is in stage 3), starting a soak (bad input
refused on the form, nothing stored), the soak page for a viewer and for a person who can
act, and stop / edit (a reason required; each a manual intervention the page names). The
plan is moved to stage 3 through its gates by the services, as people move it."""

from __future__ import annotations

import json
import re
from decimal import Decimal

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from fleetctl.batch.models import BatchFile, BatchJob, Soak
from fleetctl.fleet.models import CurrencyRate, Pool
from migrations_plan.models import Plan
from tests.batch.factory import request_line
from tests.batch.web.conftest import World, finish, write_results
from tests.migrations_plan.helpers import walk_to

pytestmark = pytest.mark.django_db
SOAK_LIVE = {"HX-Request": "true", "HX-Target": "soak-live"}


def upload(n: int = 4) -> SimpleUploadedFile:
    return SimpleUploadedFile("soak.jsonl", "".join(json.dumps(request_line(i)) + "\n"
                                                    for i in range(n)).encode())


def soak_data(**overrides: object) -> dict[str, object]:
    data: dict[str, object] = {"every": "30s", "duration": "10m", "concurrency": "2",
                               "rate_limit_rps": "", "completion_window": "5m", "drill": ""}
    data.update(overrides)
    return data


@pytest.fixture
def plan(world: World) -> Plan:
    return walk_to(world, world.plan(), 3)


def start(client: Client, plan: Plan, **overrides: object) -> Soak:
    response = client.post(reverse("batch:soak-start", args=[plan.name]),
                           soak_data(file=upload(), **overrides))
    assert response.status_code == 302, response.content.decode()[-3000:]
    soak = Soak.objects.get(plan=plan, state="running")
    assert response["Location"] == reverse("batch:soak-detail", args=[soak.pk])
    return soak


def panel(client: Client, plan: Plan) -> str:
    response = client.get(reverse("plans:detail", args=[plan.name]))
    assert response.status_code == 200
    page = response.content.decode()
    if 'id="batch"' not in page:
        return ""
    return page.split('id="batch"')[1].split("</section>")[0]


def test_the_plan_panel_offers_a_soak_only_in_stage_3_and_only_to_people_with_jobs(
        world: World, oncall: Client, viewer: Client):
    early = world.plan()
    assert panel(oncall, early) == ""  # stage 1: no Batch panel at all
    plan = walk_to(world, early, 3)
    mine = panel(oncall, plan)
    assert "No soak for this plan yet" in mine and 'class="soak-start-form"' in mine
    assert 'enctype="multipart/form-data"' in mine
    assert "has no predicted cost per 1M output tokens" in mine  # the arbitrage, honestly
    theirs = panel(viewer, plan)
    assert "No soak for this plan yet" in theirs and 'class="soak-start-form"' not in theirs
    assert "needs the <code>jobs</code> permission" in theirs


def test_start_a_soak_then_read_it_as_a_viewer_and_as_on_call(plan: Plan, oncall: Client,
                                                              viewer: Client, world: World):
    soak = start(oncall, plan)
    assert (soak.every_s, soak.duration_s, soak.concurrency, soak.pool) == (
        30, 600, 2, world.candidate)
    [job] = BatchJob.objects.filter(soak=soak)
    mine = oncall.get(reverse("batch:soak-detail", args=[soak.pk])).content.decode()
    assert 'data-state="running"' in mine and 'hx-trigger="every 3s"' in mine
    assert f'data-job="{job.pk}"' in mine
    assert 'class="soak-stop-form"' in mine and 'class="soak-edit-form"' in mine
    assert "<strong>manual intervention</strong>" in mine
    theirs = viewer.get(reverse("batch:soak-detail", args=[soak.pk])).content.decode()
    assert f'data-job="{job.pk}"' in theirs and 'class="soak-stop-form"' not in theirs
    live = viewer.get(reverse("batch:soak-detail", args=[soak.pk]) + "?seen=running",
                      headers=SOAK_LIVE)
    assert live.content.decode().lstrip().startswith('<div id="soak-live"')
    assert "HX-Refresh" not in live
    # The plan's panel now shows it running, with its job, and offers no second soak.
    shown = panel(oncall, plan)
    assert f"Soak {soak.pk}</a>" in shown and f"job {job.pk}" in shown
    assert 'class="soak-start-form"' not in shown


@pytest.mark.parametrize("override, field, message", [
    ({"every": "5s"}, "every", "outside 10s to 7d"),
    ({"duration": "soon"}, "duration", "is not a duration"),
    ({"concurrency": "0"}, "concurrency", "greater than or equal to 1"),
    ({"drill": "nuke"}, "drill", "Select a valid choice"),
])
def test_bad_soak_options_are_refused_on_the_form_and_nothing_is_stored(
        plan: Plan, oncall: Client, override: dict, field: str, message: str):
    response = oncall.post(reverse("batch:soak-start", args=[plan.name]),
                           {**soak_data(file=upload()), **override})
    assert response.status_code == 400
    page = response.content.decode()
    assert message in page.split(f'id="id_{field}_error"')[1].split("</ul>")[0]
    assert not Soak.objects.exists() and not BatchFile.objects.exists()


def test_a_plan_below_stage_3_refuses_the_soak_and_says_why(world: World, oncall: Client):
    plan = world.plan()
    response = oncall.post(reverse("batch:soak-start", args=[plan.name]),
                           soak_data(file=upload()))
    assert response.status_code == 409
    page = response.content.decode()
    assert "a soak runs on the candidate while the plan is at stage 3" in page
    assert not Soak.objects.exists() and not BatchJob.objects.exists()


def test_a_viewer_cannot_start_a_soak(plan: Plan, viewer: Client):
    page = viewer.get(reverse("batch:soak-start", args=[plan.name])).content.decode()
    assert "needs the <code>jobs</code> permission" in page
    response = viewer.post(reverse("batch:soak-start", args=[plan.name]),
                           soak_data(file=upload()))
    assert response.status_code == 403
    assert not Soak.objects.exists() and not BatchFile.objects.exists()


def test_stop_needs_a_reason_and_is_a_manual_intervention(plan: Plan, oncall: Client):
    soak = start(oncall, plan)
    url = reverse("batch:soak-stop", args=[soak.pk])
    refused = oncall.post(url, {"reason": ""})
    assert refused.status_code == 400 and "Say why" in refused.content.decode()
    soak.refresh_from_db()
    assert soak.state == "running"
    assert oncall.post(url, {"reason": "the pool needs a driver update"}).status_code == 302
    soak.refresh_from_db()
    assert soak.state == "stopped"
    page = oncall.get(reverse("batch:soak-detail", args=[soak.pk])).content.decode()
    interventions = page.split("soak-interventions-card")[1]
    assert "olga" in interventions and "the pool needs a driver update" in interventions
    assert 'class="soak-stop-form"' not in page and 'hx-trigger' not in page


def test_edit_validates_then_changes_the_schedule(plan: Plan, oncall: Client):
    soak = start(oncall, plan)
    url = reverse("batch:soak-edit", args=[soak.pk])
    nothing = oncall.post(url, {"reason": "slower", "every": "", "concurrency": ""})
    assert nothing.status_code == 400 and "Change at least one of" in nothing.content.decode()
    no_reason = oncall.post(url, {"every": "1m", "reason": " "})
    assert no_reason.status_code == 400
    soak.refresh_from_db()
    assert soak.every_s == 30 and not soak.events.filter(manual=True).exists()
    assert oncall.post(url, {"every": "1m", "reason": "less load at night"}).status_code == 302
    soak.refresh_from_db()
    assert soak.every_s == 60
    page = oncall.get(reverse("batch:soak-detail", args=[soak.pk])).content.decode()
    assert 'class="badge manual-badge"' in page and "less load at night" in page


def test_the_arbitrage_states_the_conversion_and_never_mixes_currencies(
        plan: Plan, oncall: Client, world: World):
    Plan.objects.filter(pk=plan.pk).update(predicted_cost_per_1m=Decimal("500"),
                                           predicted_cost_currency="EUR",
                                           predicted_cost_source="benchmark 7")
    Pool.objects.filter(pk=world.candidate.pk).update(currency="USD",
                                                      node_hourly_rate=Decimal("36"))
    soak = start(oncall, plan)
    job = BatchJob.objects.get(soak=soak)
    write_results(job, range(4), seconds_apart=0.5)
    finish(job)
    no_rate = panel(oncall, plan)
    assert "there is no USD/EUR rate" in no_rate and 'data-status="insufficient"' in no_rate
    assert "converted:" not in no_rate
    # A fresh rate: one older than the conversion's limit (31 days) is no rate (test_cost.py).
    CurrencyRate.objects.create(from_currency="USD", to_currency="EUR", rate=Decimal("0.9"),
                                as_of=timezone.localdate(), created_by="test")
    shown = panel(oncall, plan)
    assert "converted: 1 USD = 0.90 EUR" in shown
    figures = shown.split('class="compact kv arbitrage-figures"')[1].split("</table>")[0]
    rows = {row.split("</th>")[0]: row.split("</th>")[1]
            for row in figures.split('scope="row">')[1:]}
    assert rows["Predicted, per 1M output tokens"].startswith('<td class="num">500.00 EUR')
    # Each amount beside its own currency; the measured one converted on a row of its own.
    assert re.match(r'<td class="num">\d+\.\d+ USD ', rows["Measured, per 1M output tokens"])
    assert re.match(r'<td class="num">\d+\.\d+ EUR ', rows["Measured, in EUR"])
    assert 'data-status="fail"' in shown  # 36 USD/h at well under 1 token/s is dear
    page = oncall.get(reverse("batch:soak-detail", args=[soak.pk])).content.decode()
    assert "converted: 1 USD = 0.90 EUR" in page
