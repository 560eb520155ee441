"""The conformance pages: the list with the suite, the new-run form (bad input shown on the
form, nothing stored), the gate button's POST (refused for a viewer, audited), and the run
page's live block for htmx."""

from __future__ import annotations

import pytest
from django.test import Client

from fleetctl.audit.models import AuditEvent
from fleetctl.conformance.models import ConformanceCase, ConformanceRun
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def test_the_form_shows_what_is_wrong_and_stores_nothing(world: World):  # noqa: F811
    world.plan()
    oncall = signed_in(world.oncall)
    page = oncall.get("/conformance/runs/new/?pool=mi300x-us")
    assert page.status_code == 200 and b"Start the run" in page.content
    wrong = oncall.post("/conformance/runs/new/", {"pool": "h200-us", "plan": "mi300x-llama"})
    assert wrong.status_code == 200
    assert "migrates to mi300x-us, not h200-us" in wrong.content.decode()
    unknown = oncall.post("/conformance/runs/new/", {"pool": "nope"})
    assert unknown.status_code == 200 and "Select a valid choice" in unknown.content.decode()
    assert not ConformanceRun.objects.exists()
    started = oncall.post("/conformance/runs/new/", {"pool": "mi300x-us",
                                                      "primary": "h200-us"})
    run = ConformanceRun.objects.get()
    assert started.status_code == 302 and started["Location"] == f"/conformance/runs/{run.pk}/"
    assert run.primary == world.primary and not run.include_saturation


def test_the_gate_button_starts_a_run_for_jobs_and_not_for_a_viewer(world: World):  # noqa: F811
    plan = world.plan()
    gate = signed_in(world.oncall).get(f"/plans/{plan.name}/").content.decode()
    assert "Run the conformance probe" in gate
    assert f'action="/conformance/plans/{plan.name}/run/"' in gate
    viewer = signed_in(world.viewer)
    assert "Run the conformance probe" not in viewer.get(f"/plans/{plan.name}/").content.decode()
    refused = viewer.post(f"/conformance/plans/{plan.name}/run/")
    assert refused.status_code == 302 and refused["Location"] == f"/plans/{plan.name}/"
    assert not ConformanceRun.objects.exists()
    assert AuditEvent.objects.filter(action="conformance.run.create", outcome="denied").exists()
    started = signed_in(world.oncall).post(f"/conformance/plans/{plan.name}/run/")
    run = ConformanceRun.objects.get()
    assert started["Location"] == f"/conformance/runs/{run.pk}/"
    assert (run.pool, run.primary, run.plan) == (world.candidate, world.primary, plan)
    # While it is queued, the gate says so and the button is disabled.
    gate = signed_in(world.oncall).get(f"/plans/{plan.name}/").content.decode()
    assert "a run is queued" in gate and f"run {run.pk}" in gate
    assert signed_in(world.oncall).post("/conformance/plans/nope/run/").status_code == 404


def test_the_list_and_the_run_page(world: World):  # noqa: F811
    run = ConformanceRun.objects.create(pool=world.candidate, primary=world.primary,
                                        model_id="llama-3.1-8b-instruct", created_by="olga")
    ConformanceCase.objects.create(run=run, pool=world.candidate, role="pool",
                                   endpoint=world.candidate.base_urls[0].rstrip("/"),
                                   key="tools.required", title="Tools", required=True,
                                   status="fail", expected="tool_calls",
                                   got="no tool_calls <script>x</script>")
    viewer = signed_in(world.viewer)
    listing = viewer.get("/conformance/").content.decode()
    assert f'data-run="{run.pk}"' in listing and "tools.required" in listing
    assert "New run" not in listing
    page = viewer.get(f"/conformance/runs/{run.pk}/").content.decode()
    assert 'hx-trigger="every 2s"' in page  # queued: the live block polls
    assert "no tool_calls &lt;script&gt;" in page and "<script>x" not in page
    live = viewer.get(f"/conformance/runs/{run.pk}/", HTTP_HX_REQUEST="true",
                      HTTP_HX_TARGET="conformance-live").content.decode()
    assert 'id="conformance-live"' in live
    assert "<html" not in live
    assert viewer.get("/conformance/runs/999999/").status_code == 404
    assert viewer.get("/conformance/?status=sideways").status_code == 200
