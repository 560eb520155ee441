"""The metric-source pages: list, add, edit, delete (refused while a gate check or a ramp
reads the source, naming them), and a test query through the checks' own query path against
a real HTTP JSON endpoint; administrators write, platform leads test, everyone reads."""

from __future__ import annotations

import html
from typing import Any

import pytest
from django.test import Client
from django.urls import reverse

from fleetctl.audit.models import AuditEvent
from fleetctl.prometheus import evidence, services
from fleetctl.prometheus.models import MetricSource
from fleetctl.ramps.models import Ramp
from migrations_plan import services as plans

pytestmark = pytest.mark.django_db


def login(user: Any) -> Client:
    client = Client()
    client.force_login(user)
    return client


def beside(response: Any, field: str) -> str:
    """The rendered block of one form field (its label, widget, help and errors)."""
    text = response.content.decode()
    blocks = [b for b in text.split('<div class="field') if f'name="{field}"' in b]
    assert blocks, f"no field {field} on the page"
    return html.unescape(blocks[0])


def form(**changes: str) -> dict[str, str]:
    return {"name": "stats", "kind": "http-json", "base_url": "http://10.0.0.5:9090",
            "bearer_token": "", "timeout_s": "2", **changes}


def test_an_administrator_adds_and_edits_a_source_audited_token_never_shown(world):
    admin = login(world.admin)
    added = admin.post(reverse("metric_sources:create"), form(bearer_token="s3cret"))
    assert added.status_code == 302, added.content.decode()[:2000]
    assert added["Location"] == reverse("metric_sources:detail", args=["stats"])
    source = MetricSource.objects.get(name="stats")
    assert (source.kind, source.bearer_token, source.timeout_s) == ("http-json", "s3cret", 2.0)
    created = AuditEvent.objects.get(action="metric-source.create")
    assert created.actor == world.admin.username and "s3cret" not in str(created.after)
    page = admin.get(reverse("metric_sources:detail", args=["stats"])).content.decode()
    assert "http://10.0.0.5:9090" in page and "s3cret" not in page and "never queried" in page
    # Edit: an empty token field keeps the token; the name cannot change.
    edited = admin.post(reverse("metric_sources:edit", args=["stats"]),
                        form(name="renamed", timeout_s="7.5"))
    assert edited.status_code == 302, edited.content.decode()[:2000]
    source.refresh_from_db()
    assert (source.name, source.timeout_s, source.bearer_token) == ("stats", 7.5, "s3cret")
    updated = AuditEvent.objects.get(action="metric-source.update")
    assert updated.before == {"timeout_s": 2.0} and updated.after == {"timeout_s": 7.5}
    admin.post(reverse("metric_sources:edit", args=["stats"]), form(clear_token="on"))
    source.refresh_from_db()
    assert source.bearer_token == ""
    listed = admin.get(reverse("metric_sources:list")).content.decode()
    assert 'href="/metric-sources/stats/"' in listed and "http-json" in listed
    assert 'href="/metric-sources/"' in listed, "the navigation links the page"


def test_bad_input_is_refused_beside_the_field_and_nothing_is_stored(world):
    admin = login(world.admin)
    for changes, field, said in (
            ({"base_url": "http://169.254.169.254/"}, "base_url", "metadata"),
            ({"base_url": "ftp://10.0.0.5/"}, "base_url", "http"),
            ({"timeout_s": "600"}, "timeout_s", "less than or equal to 60"),
            ({"kind": "graphite"}, "kind", "not one of the available choices"),
            ({"name": "Not A Slug"}, "name", "letters, numbers, underscores or hyphens")):
        answer = admin.post(reverse("metric_sources:create"), form(**changes))
        assert answer.status_code == 400, (changes, answer.status_code)
        assert said in beside(answer, field), (changes, beside(answer, field))
    assert not MetricSource.objects.exists()
    services.source_create(actor=world.actor("admin"), name="stats", base_url="http://10.0.0.5")
    twice = admin.post(reverse("metric_sources:create"), form())
    assert twice.status_code == 409 and "A metric source named stats exists" in \
        html.unescape(twice.content.decode())
    assert MetricSource.objects.count() == 1


def test_readers_and_leads_see_the_pages_but_only_administrators_write(world):
    services.source_create(actor=world.actor("admin"), name="stats", base_url="http://10.0.0.5")
    viewer, lead = login(world.viewer), login(world.lead)
    for client in (viewer, lead):
        listed = client.get(reverse("metric_sources:list"))
        assert listed.status_code == 200 and "stats" in listed.content.decode()
        assert "New metric source" not in listed.content.decode()
        detail = client.get(reverse("metric_sources:detail", args=["stats"])).content.decode()
        assert "Edit</a>" not in detail and "Delete</button>" not in detail
        created = client.post(reverse("metric_sources:create"), form(name="other"))
        assert created.status_code == 403
        edited = client.post(reverse("metric_sources:edit", args=["stats"]),
                             form(timeout_s="9"))
        assert edited.status_code == 403
        client.post(reverse("metric_sources:delete", args=["stats"]), {"confirm": "yes"})
    source = MetricSource.objects.get()
    assert source.name == "stats" and source.timeout_s == 5.0
    assert AuditEvent.objects.filter(action__startswith="metric-source.", outcome="denied",
                                     actor=world.viewer.username).count() == 3
    # Testing a query is a platform lead's (it asks the source on their behalf), not a
    # viewer's.
    refused = viewer.post(reverse("metric_sources:test", args=["stats"]), {"query": "/x"})
    assert refused.status_code == 403 and "needs a role that grants it" in \
        html.unescape(refused.content.decode())
    assert AuditEvent.objects.filter(action="metric-source.test", outcome="denied").exists()
    assert "Run the query" in lead.get(reverse("metric_sources:detail",
                                               args=["stats"])).content.decode()
    assert login(world.viewer).get("/metric-sources/nope/").status_code == 404


def test_delete_is_refused_while_a_gate_check_or_a_ramp_reads_the_source(world):
    services.source_create(actor=world.actor("admin"), name="prom", base_url="http://10.0.0.5")
    plan = world.plan()
    check = plans.check_add(actor=world.actor("author"), plan=plan, stage=1,
                            rule=evidence.QUERY_RULE, title="",
                            params={"source": "prom", "query": "up", "success": "result == 1"})
    ramp = Ramp.objects.create(
        route=world.route, pool=world.candidate, steps=[{"percent": 5, "hold_s": 60}],
        slo_ttft_p95_ms=800, slo_tpot_p95_ms=60, slo_error_rate=0.01, latency_margin_pct=10,
        created_by="test", state=Ramp.State.PAUSED,
        metric_checks=[{"source": "prom", "query": "up", "success": "result == 1"}])
    admin = login(world.admin)
    listed = html.unescape(admin.get(reverse("metric_sources:list")).content.decode())
    assert f"plan {plan.name}, stage 1 check {check.key}" in listed
    assert f"ramp {ramp.pk} (mi300x-us on llama, paused)" in listed
    refused = admin.post(reverse("metric_sources:delete", args=["prom"]), {"confirm": "yes"},
                         follow=True)
    said = html.unescape(refused.content.decode())
    assert "Metric source prom is in use" in said
    assert f"plan {plan.name}, stage 1 check {check.key}" in said and f"ramp {ramp.pk}" in said
    assert MetricSource.objects.filter(name="prom").exists()
    # The API refuses the same way.
    from rest_framework.test import APIClient
    api = APIClient()
    api.force_login(world.admin)
    answer = api.delete("/api/v1/metric-sources/prom/")
    assert answer.status_code == 409 and f"ramp {ramp.pk}" in answer.content.decode()
    # Once neither reads it (the check removed, the ramp ended), it goes, audited.
    plans.check_remove(actor=world.actor("author"), check=check, reason="measured elsewhere")
    Ramp.objects.filter(pk=ramp.pk).update(state=Ramp.State.ABORTED)
    unticked = admin.post(reverse("metric_sources:delete", args=["prom"]), {}, follow=True)
    assert "Tick the box" in html.unescape(unticked.content.decode())
    assert MetricSource.objects.filter(name="prom").exists()
    gone = admin.post(reverse("metric_sources:delete", args=["prom"]), {"confirm": "yes"})
    assert gone.status_code == 302 and gone["Location"] == reverse("metric_sources:list")
    assert not MetricSource.objects.exists()
    assert AuditEvent.objects.get(action="metric-source.delete").before["name"] == "prom"


def test_a_test_query_shows_the_result_or_the_error_in_plain_words(world, json_endpoint):
    services.source_create(actor=world.actor("admin"), name="stats", kind="http-json",
                           base_url=json_endpoint.url, timeout_s=2)
    json_endpoint.json("/slo/mi300x-us", {"data": {"error_rate": 0.002}})
    lead = login(world.lead)
    url = reverse("metric_sources:test", args=["stats"])
    shown = lead.post(url, {"query": "/slo/$pool", "field": "data.error_rate",
                            "success": "result < 0.01", "pool": "mi300x-us"})
    assert shown.status_code == 200
    page = html.unescape(shown.content.decode())
    assert 'data-verdict="pass"' in page and "/slo/mi300x-us" in page
    assert "= 0.002" in page and "'result < 0.01' holds" in page
    # No condition: the values, unjudged.
    unjudged = html.unescape(lead.post(url, {"query": "/slo/mi300x-us",
                                             "field": "data.error_rate"}).content.decode())
    assert "answered" in unjudged and "not judged" in unjudged and "0.002" in unjudged
    # The source's trouble in plain words, and remembered as its last outcome.
    missing = html.unescape(lead.post(url, {"query": "/slo/mi300x-us", "field": "data.p95",
                                            "success": "result < 1"}).content.decode())
    assert 'data-verdict="insufficient"' in missing and "no data, never a pass" in missing
    listed = html.unescape(lead.get(reverse("metric_sources:list")).content.decode())
    assert "no series (queried from stats)" in listed
    assert MetricSource.objects.get().last_status == "insufficient"
    # A condition that is not one is refused beside its field, and nothing is asked.
    asked = len(json_endpoint.asked)
    bad = lead.post(url, {"query": "/slo/mi300x-us", "success": "result = 1"})
    assert bad.status_code == 400
    assert "'result = 1' is not 'result <op> <number>'" in beside(bad, "success")
    empty = lead.post(url, {"query": ""})
    assert empty.status_code == 400 and "This field is required" in beside(empty, "query")
    assert len(json_endpoint.asked) == asked
    # A source that does not answer.
    MetricSource.objects.filter(name="stats").update(base_url="http://127.0.0.1:9")
    down = html.unescape(lead.post(url, {"query": "/x", "field": "v",
                                         "success": "result < 1"}).content.decode())
    assert "the source is unreachable" in down
