"""A route's capacity split (fleetctl/traffic/capacity_split.py) and applying it
(services.route_capacity_split_apply): in proportion to each pool's SLO-qualified tokens/s
from benchmark evidence, the reason naming the runs and what was left out; refusals change
nothing. Through the service, the REST API and the route page."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from fleetctl.audit.models import AuditEvent
from fleetctl.core.errors import ConflictError, PermissionDeniedError
from fleetctl.fleet.services import pool_health_record, pool_model_create, pool_update
from fleetctl.traffic import services
from fleetctl.traffic.capacity_split import route_capacity_split
from fleetctl.traffic.models import Route, SplitRevision
from tests.bench.test_capacity import BOT, _bench
from tests.migrations_plan.conftest import MODEL, world  # noqa: F401


@pytest.fixture
def benched(world, make_pool, system):  # noqa: F811
    """The world's H200 primary measured at 3,000 tok/s and its MI300X at 1,000 (one
    endpoint each), and a third pool serving the model that was never benchmarked."""
    third = make_pool(name="gaudi3-us", runtime="gaudi")
    pool_model_create(actor=system, pool=third, model_id=MODEL, max_context_tokens=8192)
    for _ in range(2):
        pool_health_record(pool_id=third.pk, ok=True, status_code=200, latency_ms=1.0)
    _bench(world.primary, run=11, best=24, tokens=3000.0, endpoints=1)
    _bench(world.candidate, run=12, best=8, tokens=1000.0, endpoints=1)
    return world


def _route() -> Route:
    return Route.objects.select_related("primary_pool").get(name="llama")


def test_the_split_follows_capacity_and_its_reason_names_the_runs(benched):
    split = route_capacity_split(route=_route())
    assert split.refusal == "" and split.weights == {"h200-us": 7500, "mi300x-us": 2500}
    rows = {row.pool: row for row in split.rows}
    assert (rows["h200-us"].current_bp, rows["h200-us"].suggested_bp) == (10_000, 7500)
    assert rows["gaudi3-us"].suggested_bp == 0
    assert "no benchmark of it for llama-3.1-8b-instruct yet" in rows["gaudi3-us"].left_out

    lead = benched.actor("lead")
    revision = services.route_capacity_split_apply(actor=lead, route=_route(),
                                                   base_revision=1, note="more headroom")
    assert (revision.kind, revision.number, revision.weights) == (
        SplitRevision.Kind.CAPACITY, 2, {"h200-us": 7500, "mi300x-us": 2500})
    assert "h200-us 3,000 tok/s (benchmark run 11 on 2026-12-01) → 75 %" in revision.reason
    assert "mi300x-us 1,000 tok/s (benchmark run 12 on 2026-12-01) → 25 %" in revision.reason
    assert "Left at 0 %: gaudi3-us (no benchmark of it" in revision.reason
    assert revision.reason.endswith("Note: more headroom")
    event = AuditEvent.objects.get(action="revision.capacity")
    assert event.actor == "bob" and event.after["weights"] == {"h200-us": 75.0,
                                                                "mi300x-us": 25.0}

    # Applying it again changes nothing: no revision, no audit event.
    again = services.route_capacity_split_apply(actor=lead, route=_route(), base_revision=2)
    assert getattr(again, "unchanged", False) and _route().revision_number == 2
    assert route_capacity_split(route=_route()).unchanged


def test_refusals_name_the_problem_and_change_nothing(benched):
    lead, route = benched.actor("lead"), _route()
    with pytest.raises(ValidationError) as bad:
        services.route_capacity_split_apply(actor=lead, route=route, base_revision=0)
    assert "base_revision" in bad.value.message_dict
    with pytest.raises(ValidationError) as future:
        services.route_capacity_split_apply(actor=lead, route=route, base_revision=7)
    assert "revision 7 does not exist" in str(future.value)
    with pytest.raises(PermissionDeniedError):
        services.route_capacity_split_apply(actor=benched.actor("viewer"), route=route,
                                            base_revision=1)
    # Someone changed the split since the page was read: 409, the capacity split not stored.
    services.revision_create(actor=lead, route=route, weights={"h200-us": 90,
                                                               "mi300x-us": 10},
                             base_revision=1, reason="by hand")
    with pytest.raises(ConflictError, match="is at revision 2, not 1"):
        services.route_capacity_split_apply(actor=lead, route=route, base_revision=1)
    assert _route().revision_number == 2

    # A primary with no figure: no split is offered, so nothing moves off it.
    pool_update(actor=BOT, pool=benched.primary, runtime_version="vllm-9.9")  # run 11 stale
    split = route_capacity_split(route=_route())
    assert split.weights == {} and "its primary h200-us has no capacity figure" in split.refusal
    assert "runtime version changed" in split.refusal
    with pytest.raises(ValidationError) as refused:
        services.route_capacity_split_apply(actor=lead, route=_route(), base_revision=2)
    assert "its primary h200-us has no capacity figure" in refused.value.message_dict[
        "capacity"][0]
    assert _route().revision_number == 2


def test_a_pool_its_stage_keeps_off_live_traffic_is_left_at_zero(benched):
    benched.plan()  # the MI300X is the candidate of a plan in stage 1: no live weight
    split = route_capacity_split(route=_route())
    assert split.weights == {"h200-us": 10_000}
    left = {row.pool: row.left_out for row in split.rows}
    assert "stage" in left["mi300x-us"], left
    assert "Left at 0 %: " in split.reason and "mi300x-us (" in split.reason


def test_rest_reads_and_applies_the_capacity_split(benched, client_for):
    oncall = client_for("on-call", username="otto")
    body = oncall.get("/api/v1/routes/llama/capacity/").json()
    assert (body["revision"], body["weights"], body["refusal"]) == (
        1, {"h200-us": 75.0, "mi300x-us": 25.0}, "")
    pools = {row["pool"]: row for row in body["pools"]}
    assert pools["h200-us"]["tokens_per_s"] == 3000.0 and pools["h200-us"]["run"] == 11
    assert pools["h200-us"]["current_percent"] == 100.0
    assert pools["mi300x-us"]["suggested_percent"] == 25.0
    assert pools["gaudi3-us"]["tokens_per_s"] is None and pools["gaudi3-us"]["left_out"]

    missing = oncall.post("/api/v1/routes/llama/capacity/apply/", {}, format="json")
    assert missing.status_code == 400 and "base_revision" in missing.json()["error"]["message"]
    applied = oncall.post("/api/v1/routes/llama/capacity/apply/", {"base_revision": 1},
                        format="json")
    assert applied.status_code == 201, applied.json()
    assert applied.json()["kind"] == "capacity" and applied.json()["weights"] == {
        "h200-us": 75.0, "mi300x-us": 25.0}
    again = oncall.post("/api/v1/routes/llama/capacity/apply/", {"base_revision": 1},
                        format="json")
    assert again.status_code == 409 and again.json()["current_revision"] == 2
    viewer = client_for("viewer", username="vic2")
    assert viewer.post("/api/v1/routes/llama/capacity/apply/", {"base_revision": 2},
                       format="json").status_code == 403


def test_the_route_page_shows_the_card_and_one_click_applies_it(benched, make_user):
    page = Client()
    page.force_login(make_user("olga2", "on-call"))
    url = reverse("traffic:route-detail", args=["llama"])
    # The page loads the card after itself (htmx asks for the block): the page stays cheap.
    html = page.get(url).content.decode()
    assert 'id="capacity"' in html and 'hx-trigger="load"' in html
    assert "Apply capacity split" not in html
    block = page.get(url, headers={"HX-Request": "true", "HX-Target": "capacity"})
    html = block.content.decode()
    assert "<html" not in html and 'hx-trigger="load"' not in html  # the card alone
    assert "Apply capacity split" in html and 'name="base_revision" value="1"' in html
    assert "benchmark run 11 on 2026-12-01" in html and "75 %" in html
    assert "Apply capacity split" in page.get(url + "?capacity").content.decode()  # no JS
    response = page.post(reverse("traffic:route-capacity-apply", args=["llama"]),
                         {"base_revision": "1"})
    assert response.status_code == 302 and response["Location"].endswith("?capacity#capacity")
    route = _route()
    current = route.revisions.get(number=route.revision_number)
    assert (current.kind, current.weights) == ("capacity", {"h200-us": 7500,
                                                            "mi300x-us": 2500})
    html = page.get(url + "?capacity").content.decode()
    assert "The capacity split is the split in force." in html
    assert "Apply capacity split" not in html

    viewer = Client()
    viewer.force_login(make_user("vera2", "viewer"))
    assert "Apply capacity split" not in viewer.get(url + "?capacity").content.decode()


RAMP_SLO = {"slo_ttft_p95_ms": 500.0, "slo_tpot_p95_ms": 100.0, "slo_error_rate": 0.05}


def test_a_ramp_to_capacity_resolves_its_last_step_when_it_starts(benched, client_for):
    from fleetctl.ramps.models import RampEvent
    from fleetctl.ramps.services import ramp_create

    lead, route = benched.actor("lead"), _route()

    def start(*steps):
        return ramp_create(actor=lead, route=route, pool=benched.candidate, **RAMP_SLO,
                           steps=[{"percent": p, "hold_s": 30} for p in steps])

    for steps, says in (((5, "capacity", 30), 'Step 2: only the last step may be "capacity"'),
                        ((30, "capacity"), "capacity split, 25 %, not above step 1 (30 %)")):
        with pytest.raises(ValidationError, match=says.replace("(", r"\(").replace(")", r"\)")):
            start(*steps)
    ramp = start(5, "capacity")
    assert [step["percent"] for step in ramp.steps] == [5.0, 25.0]
    event = RampEvent.objects.get(ramp=ramp, kind="start")
    assert event.numbers["capacity"]["runs"] == {"h200-us": 11, "mi300x-us": 12}
    assert event.numbers["capacity"]["percent"] == 25.0
    assert "its last step is mi300x-us's share of the capacity split at revision 1" \
        in event.message and "benchmark run 12 on 2026-12-01" in event.message
    assert AuditEvent.objects.get(action="ramp.create").after["capacity"]["step"] == 2


def test_a_ramp_to_capacity_of_a_pool_with_no_figure_is_refused_through_the_api(
        benched, client_for):
    from fleetctl.ramps.models import Ramp

    lead = client_for("platform-lead", username="pete")
    body = {"route": "llama", "pool": "gaudi3-us", **RAMP_SLO,
            "steps": [{"percent": 5, "hold_s": 30}, {"percent": "capacity", "hold_s": 30}]}
    response = lead.post("/api/v1/ramps/", body, format="json")
    assert response.status_code == 400, response.json()
    assert ("gaudi3-us has no share of llama's capacity split (no benchmark of it"
            in response.json()["error"]["message"])
    assert not Ramp.objects.exists()
    body["pool"] = "mi300x-us"
    response = lead.post("/api/v1/ramps/", body, format="json")
    assert response.status_code == 201, response.json()
    assert [step["percent"] for step in response.json()["steps"]] == [5.0, 25.0]


def test_the_dashboard_and_cli_step_parsers_take_capacity_last():
    from fleetctl.cli.ramps import parse_steps as cli_steps
    from fleetctl.ramps.forms import parse_steps as form_steps

    assert form_steps("5:60, capacity:120") == [{"percent": 5.0, "hold_s": 60},
                                                {"percent": "capacity", "hold_s": 120}]
    assert cli_steps("5:60,capacity:120") == [{"percent": 5.0, "hold_s": 60.0},
                                              {"percent": "capacity", "hold_s": 120.0}]
    import argparse

    with pytest.raises(argparse.ArgumentTypeError):
        cli_steps("capacity:60,50:60")
