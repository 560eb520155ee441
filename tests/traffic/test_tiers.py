"""Context tiers of a route (issue 28): route policy as data, each tier's eligible pools
computed from the registry and what the pools report, validation that names the tier, the
409 on lowering a pool's context under a tier it carries, the REST round trip and the route
page for every role."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.core.errors import ConflictError, PermissionDeniedError
from fleetctl.fleet import services as fleet
from fleetctl.fleet.models import Pool, PoolModel
from fleetctl.traffic import services, tiers
from fleetctl.traffic.models import ContextTier, Route
from migrations_plan.services import plan_create
from tests.conftest import SYSTEM

pytestmark = pytest.mark.django_db

MODEL = "llama-3.1-8b-instruct"
TIERS: list[dict[str, Any]] = [
    {"max_prompt_tokens": 8192, "behaviour": "failover"},
    {"max_prompt_tokens": 32768, "behaviour": "queue", "queue_max": 64, "retry_after_s": 5},
    {"behaviour": "reject"},
]


def serving(pool: Pool, context: int, *, reports: int | None = None) -> Pool:
    """`pool` registered to serve MODEL at `context`, probed healthy (reporting `reports` as
    its max_model_len, as the health probe records it)."""
    fleet.pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=context)
    reported = {"max_model_len": {MODEL: reports}} if reports else None
    fleet.pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0,
                             reported=reported)
    pool.refresh_from_db()
    return pool


@pytest.fixture
def world(make_pool: Any, make_user: Any) -> SimpleNamespace:
    """A US-pinned standard-class route `llama`, all on `big` (32k), and pools each kept
    off some tier for one reason: `small` (8k), `liar` (registered 32k, serves 16k), `eu`
    (another jurisdiction), `slow` (batch class), `cand` (a plan's candidate at stage 1)."""
    eu_region = fleet.region_create(actor=SYSTEM, code="eu-west", name="EU West",
                                    jurisdiction="EU")
    big = serving(make_pool(name="big", latency_class="interactive"), 32768, reports=32768)
    small = serving(make_pool(name="small", max_context_tokens=8192), 8192)
    liar = serving(make_pool(name="liar"), 32768, reports=16384)
    eu = serving(make_pool(name="eu", region=eu_region), 32768)
    slow = serving(make_pool(name="slow", latency_class="batch"), 32768)
    cand = serving(make_pool(name="cand", runtime="rocm"), 32768)
    route = services.route_create(actor=SYSTEM, name="llama", model_id=MODEL, primary_pool=big,
                                  latency_class="standard", residency="US")
    lead = Actor(user=make_user("lead", "platform-lead"))
    plan_create(actor=lead, name="cand-plan", candidate_pool=cand, primary_pool=big,
                routes=[route], slo_ttft_p95_ms=450, slo_tpot_p95_ms=80, slo_error_rate=0.02)
    return SimpleNamespace(route=route, big=big, small=small, liar=liar, eu=eu, slow=slow,
                           cand=cand, lead=lead)


def saved(route: Route) -> list[dict[str, Any]]:
    return [services.tiers.tier_dict(t) for t in ContextTier.objects.filter(route=route)]


class TestEligiblePools:
    def test_each_tier_gets_the_pools_that_serve_its_largest_prompt_and_says_why_not(
            self, world: SimpleNamespace) -> None:
        views = services.route_tiers_set(actor=world.lead, route=world.route, tiers=TIERS)
        assert [v.eligible_names for v in views] == [["big", "liar", "small"], ["big"], []]
        why = {c.pool.name: reason for c, reason in views[1].others}
        assert why["small"] == "context too small: registered for 8,192 tokens"
        assert why["liar"] == ("reports less than registered: its servers report "
                               "max_model_len 16,384 (registered 32,768)")
        assert why["eu"] == "other jurisdiction: EU, the route is pinned to US"
        assert why["slow"] == "latency class batch, slower than the route's standard"
        assert why["cand"].startswith("stage: candidate of plan cand-plan")
        # Residency first, and only: the EU pool is refused for its border on every tier.
        assert {c.pool.name: r for c, r in views[0].others}["eu"] == why["eu"]
        # Nothing serves above 32k: the open tier refuses every such prompt (413).
        assert views[2].refuses_all and views[2].needed == 32769
        assert saved(world.route) == [
            {"max_prompt_tokens": 8192, "behaviour": "failover", "queue_max": None,
             "retry_after_s": None},
            {"max_prompt_tokens": 32768, "behaviour": "queue", "queue_max": 64,
             "retry_after_s": 5},
            {"max_prompt_tokens": None, "behaviour": "reject", "queue_max": None,
             "retry_after_s": None}]

    def test_eligibility_is_computed_so_a_report_moves_a_pool_at_once(
            self, world: SimpleNamespace) -> None:
        services.route_tiers_set(actor=world.lead, route=world.route, tiers=TIERS)
        fleet.pool_health_record(pool_id=world.liar.pk, ok=True, status_code=200,
                                 latency_ms=1.0, reported={"max_model_len": {MODEL: 32768}})
        route = Route.objects.get(pk=world.route.pk)
        assert tiers.route_tier_pools(route)[1].eligible_names == ["big", "liar"]
        fleet.pool_health_record(pool_id=world.big.pk, ok=True, status_code=200,
                                 latency_ms=1.0, reported={"max_model_len": {MODEL: 8192}})
        assert tiers.route_tier_pools(route)[1].eligible_names == ["liar"]

    def test_an_unpinned_route_of_any_class_takes_every_pool_that_fits(
            self, world: SimpleNamespace) -> None:
        route = services.route_create(actor=SYSTEM, name="any", model_id=MODEL,
                                      primary_pool=world.big)
        views = services.route_tiers_set(actor=world.lead, route=route,
                                         tiers=[{"max_prompt_tokens": 8192,
                                                 "behaviour": "failover"}])
        # cand is a plan's candidate on another route: the stage rule keeps it off any
        # interactive route (a route of no class counts as interactive).
        assert views[0].eligible_names == ["big", "eu", "liar", "slow", "small"]


BAD = [
    pytest.param([{"max_prompt_tokens": 32768, "behaviour": "failover"},
                  {"max_prompt_tokens": 8192, "behaviour": "failover"}],
                 "tiers[1].max_prompt_tokens", "tiers may not overlap", id="unordered"),
    pytest.param([{"max_prompt_tokens": 8192, "behaviour": "failover"},
                  {"max_prompt_tokens": 8192, "behaviour": "queue", "queue_max": 4,
                   "retry_after_s": 1}],
                 "tiers[1].max_prompt_tokens", "cannot share a bound", id="duplicate"),
    pytest.param([{"max_prompt_tokens": 8192, "behaviour": "failover"}, {}],
                 "tiers[1]", "An empty tier", id="empty-entry"),
    pytest.param([None], "tiers[0]", "An empty tier", id="null-entry"),
    pytest.param([{"max_prompt_tokens": 8192, "behaviour": "spill"}],
                 "tiers[0].behaviour", "Unknown behaviour 'spill'", id="unknown-behaviour"),
    pytest.param([{"max_prompt_tokens": 8192}], "tiers[0].behaviour", "Required",
                 id="no-behaviour"),
    pytest.param([{"behaviour": "failover"}, {"max_prompt_tokens": 8192,
                                              "behaviour": "failover"}],
                 "tiers[0].max_prompt_tokens", "Only the last tier may be open-ended",
                 id="open-in-the-middle"),
    pytest.param([{"max_prompt_tokens": True, "behaviour": "failover"}],
                 "tiers[0].max_prompt_tokens", "whole number", id="bool-bound"),
    pytest.param([{"max_prompt_tokens": 0, "behaviour": "failover"}],
                 "tiers[0].max_prompt_tokens", "whole number from 1", id="zero-bound"),
    pytest.param([{"max_prompt_tokens": 8192, "behaviour": "queue"}],
                 "tiers[0].queue_max", "Required for a queue tier", id="unbounded-queue"),
    pytest.param([{"max_prompt_tokens": 8192, "behaviour": "reject", "queue_max": 3}],
                 "tiers[0].queue_max", "Only a queue tier", id="queue-max-on-reject"),
    pytest.param([{"max_prompt_tokens": 8192, "behaviour": "failover", "spill": True}],
                 "tiers[0].spill", "Unknown field", id="unknown-field"),
    pytest.param([{"max_prompt_tokens": 65536, "behaviour": "failover"}],
                 "tiers[0]", "No pool can serve tier ≤ 65,536 tokens", id="unservable"),
    pytest.param([{"max_prompt_tokens": 32768, "behaviour": "failover"},
                  {"behaviour": "failover"}],
                 "tiers[1]", "No pool can serve tier above the last bound",
                 id="open-tier-without-pool"),
    pytest.param("8k", "tiers", "Give the tiers as a list", id="not-a-list"),
    pytest.param([{"max_prompt_tokens": 8192 * (i + 1), "behaviour": "failover"}
                  for i in range(9)], "tiers", "At most 8 tiers", id="too-many"),
]


class TestValidation:
    @pytest.mark.parametrize(("given", "field", "says"), BAD)
    def test_bad_tiers_are_refused_naming_the_tier_and_nothing_is_saved(
            self, world: SimpleNamespace, given: Any, field: str, says: str) -> None:
        services.route_tiers_set(actor=world.lead, route=world.route, tiers=TIERS)
        before, events = saved(world.route), AuditEvent.objects.count()
        with pytest.raises(ValidationError) as refused:
            services.route_tiers_set(actor=world.lead, route=world.route, tiers=given)
        assert says in " ".join(refused.value.message_dict[field])
        assert saved(world.route) == before
        assert AuditEvent.objects.count() == events

    def test_an_unservable_tier_says_why_each_pool_cannot(self, world: SimpleNamespace) -> None:
        with pytest.raises(ValidationError) as refused:
            services.route_tiers_set(actor=world.lead, route=world.route,
                                     tiers=[{"max_prompt_tokens": 65536,
                                             "behaviour": "pinned"}])
        text = refused.value.message_dict["tiers[0]"][0]
        assert "big: context too small: registered for 32,768 tokens" in text
        assert "eu: other jurisdiction" in text

    def test_only_fleet_managers_set_tiers_and_the_change_is_audited(
            self, world: SimpleNamespace, make_user: Any) -> None:
        oncall = Actor(user=make_user("olga", "on-call"))
        with pytest.raises(PermissionDeniedError):
            services.route_tiers_set(actor=oncall, route=world.route, tiers=TIERS)
        services.route_tiers_set(actor=world.lead, route=world.route, tiers=TIERS[:1])
        services.route_tiers_set(actor=world.lead, route=world.route, tiers=TIERS)
        assert AuditEvent.objects.filter(action="route.tiers", outcome="denied").count() == 1
        done = AuditEvent.objects.filter(action="route.tiers", outcome="ok")
        event = done.order_by("-id").first()
        assert event is not None
        assert event.before == {"tiers": saved(world.route)[:1]}
        assert event.after == {"tiers": saved(world.route)}
        # The same tiers again: nothing to record.
        services.route_tiers_set(actor=world.lead, route=world.route, tiers=TIERS)
        assert done.count() == 2
        services.route_tiers_set(actor=world.lead, route=world.route, tiers=[])
        assert saved(world.route) == []


class TestLoweringContext:
    def test_a_pool_carrying_a_tiers_traffic_cannot_drop_below_its_bound(
            self, world: SimpleNamespace) -> None:
        services.route_tiers_set(actor=world.lead, route=world.route, tiers=TIERS)
        entry = PoolModel.objects.get(pool=world.big)
        with pytest.raises(ConflictError) as refused:
            fleet.pool_model_update(actor=world.lead, entry=entry, max_context_tokens=16384)
        assert "route llama carries 100 %" in refused.value.message
        assert "tier ≤ 32,768 tokens needs 32,768 tokens" in refused.value.message
        assert "drain it off the route first" in refused.value.message
        with pytest.raises(ConflictError, match="drain it off the route first"):
            fleet.pool_update(actor=world.lead, pool=world.big, max_context_tokens=8192)
        assert PoolModel.objects.get(pool=world.big).max_context_tokens == 32768
        assert Pool.objects.get(pk=world.big.pk).max_context_tokens == 32768
        refusals = AuditEvent.objects.filter(outcome="denied",
                                             action__in=["pool.update", "pool_model.update"])
        assert refusals.count() == 2

    def test_a_pool_without_that_tiers_traffic_may_lower_its_context(
            self, world: SimpleNamespace) -> None:
        services.route_tiers_set(actor=world.lead, route=world.route, tiers=TIERS)
        entry = PoolModel.objects.get(pool=world.liar)
        fleet.pool_model_update(actor=world.lead, entry=entry, max_context_tokens=8192)
        # Raising is never refused, nor lowering within the tiers the pool still serves.
        fleet.pool_model_update(actor=world.lead, entry=PoolModel.objects.get(pool=world.big),
                                max_context_tokens=32768)
        services.revision_create(actor=world.lead, route=world.route,
                                 weights={"big": 90, "small": 10}, base_revision=1,
                                 reason="short prompts to the small pool too")
        with pytest.raises(ConflictError, match="route llama carries 10 %"):
            fleet.pool_model_update(actor=world.lead,
                                    entry=PoolModel.objects.get(pool=world.small),
                                    max_context_tokens=4096)

    def test_the_api_answers_409_in_the_one_error_shape(
            self, world: SimpleNamespace, token_client: Any) -> None:
        services.route_tiers_set(actor=world.lead, route=world.route, tiers=TIERS)
        client = token_client(["read", "fleet"], "platform-lead")
        entry = PoolModel.objects.get(pool=world.big)
        answer = client.patch(f"/api/v1/pool-models/{entry.pk}/",
                              {"max_context_tokens": 16384}, format="json")
        assert answer.status_code == 409, answer.json()
        assert answer.json()["error"]["code"] == "conflict"
        assert "drain it off the route first" in answer.json()["error"]["message"]


class TestApi:
    def test_put_then_get_round_trips_with_the_computed_pools(
            self, world: SimpleNamespace, token_client: Any) -> None:
        client = token_client(["read", "fleet"], "platform-lead")
        url = "/api/v1/routes/llama/tiers/"
        put = client.put(url, {"tiers": TIERS}, format="json")
        assert put.status_code == 200, put.json()
        body = put.json()
        assert body["route"] == "llama"
        assert [t["eligible_pools"] for t in body["tiers"]] == [["big", "liar", "small"],
                                                                ["big"], []]
        assert body["tiers"][1] | {"not_eligible": None} == {
            "max_prompt_tokens": 32768, "behaviour": "queue", "queue_max": 64,
            "retry_after_s": 5, "above_tokens": 8192, "needed_tokens": 32768,
            "eligible_pools": ["big"], "not_eligible": None}
        assert {"pool": "liar", "reason": "reports less than registered: its servers "
                "report max_model_len 16,384 (registered 32,768)"} \
            in body["tiers"][1]["not_eligible"]
        again = client.get(url).json()
        assert again.pop("live")["tiers"] == body.pop("live")["tiers"] == {}
        assert again == body

    def test_the_live_share_of_each_tier_comes_from_the_last_15_minutes_of_telemetry(
            self, world: SimpleNamespace, token_client: Any, make_user: Any) -> None:
        """Windows as the ingester writes them (per gateway, route, pool: `tiers` counts);
        the real Envoy's side is tests/traffic/envoy/test_tiers.py."""
        from datetime import timedelta

        from django.utils import timezone

        from fleetctl.telemetry.services import window_add, window_start

        services.route_tiers_set(actor=world.lead, route=world.route, tiers=TIERS)
        now = timezone.now()
        start = window_start(now.timestamp(), 10)
        for gateway, pool, tiers_seen in (("gw1", "big", {"0": 3, "1": 4, "unknown": 1}),
                                          ("gw2", "big", {"0": 1}),
                                          ("gw1", "small", {"0": 4})):
            window_add(source="gateway", source_name=gateway, route="llama", pool=pool,
                       resolution_s=10, start=start, counts={"requests": 9},
                       histograms={"tiers": tiers_seen})
        # Older than 15 minutes (and another route): not counted.
        window_add(source="gateway", source_name="gw1", route="llama", pool="small",
                   resolution_s=10, start=start - timedelta(minutes=30),
                   histograms={"tiers": {"1": 50}})
        window_add(source="gateway", source_name="gw1", route="other", pool="small",
                   resolution_s=10, start=start, histograms={"tiers": {"1": 50}})
        live = token_client(["read"], "viewer").get("/api/v1/routes/llama/tiers/").json()["live"]
        assert live["minutes"] == 15
        assert live["tiers"] == {
            "0": {"requests": 8, "pools": [
                {"pool": "big", "requests": 4, "share": 0.5, "percent": 50.0},
                {"pool": "small", "requests": 4, "share": 0.5, "percent": 50.0}]},
            "1": {"requests": 4, "pools": [
                {"pool": "big", "requests": 4, "share": 1.0, "percent": 100.0}]},
            "unknown": {"requests": 1, "pools": [
                {"pool": "big", "requests": 1, "share": 1.0, "percent": 100.0}]}}
        client = Client()
        client.force_login(make_user("vee", "viewer"))
        html = client.get(reverse("traffic:route-detail", args=["llama"])).content.decode()
        assert "Live, last 15 min" in html
        row = html[html.index('id="tier-1"'):html.index('id="tier-2"')]
        assert "4 requests" in row and "big</span> 100.0 %" in row
        assert "no requests logged" in html[html.index('id="tier-2"'):]
        assert "could not size" in html and 'id="tier-unknown"' in html

    def test_bad_tiers_are_a_400_naming_the_tier_and_change_nothing(
            self, world: SimpleNamespace, token_client: Any) -> None:
        client = token_client(["read", "fleet"], "platform-lead")
        url = "/api/v1/routes/llama/tiers/"
        client.put(url, {"tiers": TIERS}, format="json")
        answer = client.put(url, {"tiers": [{"max_prompt_tokens": 8192, "behaviour": "x"},
                                            {"max_prompt_tokens": 4096,
                                             "behaviour": "failover"}]}, format="json")
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["code"] == "invalid"
        assert set(error["fields"]) == {"tiers[0].behaviour"}
        assert "tiers[0].behaviour: Unknown behaviour 'x'" in error["message"]
        answer = client.put(url, {"tiers": [{"max_prompt_tokens": 8192,
                                             "behaviour": "failover"},
                                            {"max_prompt_tokens": 4096,
                                             "behaviour": "failover"}]}, format="json")
        assert set(answer.json()["error"]["fields"]) == {"tiers[1].max_prompt_tokens"}
        assert client.put(url, {}, format="json").json()["error"]["fields"] == {
            "tiers": ["Required: the list of tiers ([] removes them)."]}
        assert len(saved(world.route)) == 3

    def test_reading_needs_read_and_setting_needs_the_fleet_scope(
            self, world: SimpleNamespace, token_client: Any) -> None:
        url = "/api/v1/routes/llama/tiers/"
        reader = token_client(["read"], "platform-lead")
        assert reader.get(url).json() == {"route": "llama", "tiers": [], "live": {"tiers": {}}}
        assert reader.put(url, {"tiers": TIERS}, format="json").status_code == 403
        ramper = token_client(["ramp"], "on-call")
        assert ramper.put(url, {"tiers": TIERS}, format="json").status_code == 403
        assert saved(world.route) == []
        assert token_client(["read", "fleet"], "platform-lead").get(
            "/api/v1/routes/nope/tiers/").status_code == 404


ROLES = ["viewer", "on-call", "platform-lead", "admin"]


class TestPages:
    @pytest.mark.parametrize("role", ROLES)
    def test_the_route_page_shows_tiers_their_pools_and_why_for_every_role(
            self, world: SimpleNamespace, make_user: Any, role: str) -> None:
        services.route_tiers_set(actor=world.lead, route=world.route, tiers=TIERS)
        client = Client()
        client.force_login(make_user(f"p-{role}", role))
        page = client.get(reverse("traffic:route-detail", args=["llama"]))
        assert page.status_code == 200
        html = page.content.decode()
        assert "Context tiers" in html and "≤ 32,768 tokens" in html
        assert "reports less than registered" in html
        assert "every prompt above 32768 tokens is refused with 413" in html
        assert ('id="tiers-form"' in html) == (role in ("platform-lead", "admin"))

    def test_the_form_saves_tiers_and_a_refusal_names_the_tier(
            self, world: SimpleNamespace, make_user: Any) -> None:
        client = Client()
        client.force_login(make_user("lea", "platform-lead"))
        url = reverse("traffic:route-tiers", args=["llama"])
        form = {"max_prompt_tokens": ["8192", "32768", "", ""],
                "behaviour": ["failover", "queue", "reject", ""],
                "queue_max": ["", "64", "", ""], "retry_after_s": ["", "5", "", ""]}
        done = client.post(url, form, follow=True)
        assert done.status_code == 200
        assert "Context tiers of llama: ≤ 8,192 tokens: failover" in done.content.decode()
        assert [t["max_prompt_tokens"] for t in saved(world.route)] == [8192, 32768, None]
        bad = dict(form, max_prompt_tokens=["8192", "4096", "", ""])
        refused = client.post(url, bad, follow=True).content.decode()
        assert "tiers[1].max_prompt_tokens: 4,096 is below tiers[0]&#x27;s 8,192" in refused
        assert [t["max_prompt_tokens"] for t in saved(world.route)] == [8192, 32768, None]
        viewer = Client()
        viewer.force_login(make_user("vic", "viewer"))
        viewer.post(url, {"max_prompt_tokens": [""], "behaviour": [""], "queue_max": [""],
                          "retry_after_s": [""]})
        assert len(saved(world.route)) == 3

    def test_the_pool_page_shows_a_registry_claiming_more_than_its_servers(
            self, world: SimpleNamespace, make_user: Any) -> None:
        client = Client()
        client.force_login(make_user("vera", "viewer"))
        html = client.get(reverse("fleet:pool-detail", args=["liar"])).content.decode()
        assert "its servers report 16384: the registry claims more than they serve" in html
        html = client.get(reverse("fleet:pool-detail", args=["big"])).content.decode()
        assert "claims more than they serve" not in html


def test_the_route_page_with_tiers_does_not_query_per_revision_or_tier(
        world: SimpleNamespace, make_user: Any) -> None:
    """The tiers cost one query for the tiers, one for the pools serving the model, the
    stage rules' three for all the pools and one for the live share per tier (telemetry's
    windows): never one per tier, revision or pool."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    client = Client()
    client.force_login(make_user("olga", "on-call"))
    url = reverse("traffic:route-detail", args=["llama"])

    def count() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert client.get(url).status_code == 200
        return len(captured.captured_queries)

    untiered = count()
    services.route_tiers_set(actor=world.lead, route=world.route, tiers=TIERS[:1])
    one = count()
    services.route_tiers_set(actor=world.lead, route=world.route, tiers=TIERS)
    for step in range(1, 10):
        route = Route.objects.get(pk=world.route.pk)
        services.revision_create(actor=world.lead, route=route,
                                 weights={"big": 100 - step, "small": step},
                                 base_revision=route.revision_number, reason="step")
    assert count() == one
    print(f"route page queries: {untiered} without tiers, {one} with tiers (6 pools)")
    assert one - untiered <= 2 + 3 + 1


def test_the_stage_rules_of_a_route_with_8_pools_cost_three_queries_whatever_their_number(
        world: SimpleNamespace, make_pool: Any, django_assert_max_num_queries: Any) -> None:
    """tiers.candidates asks the stage rules for every pool at once (the migration plans'
    batch guard): the same reasons as pool by pool, without a read per pool."""
    from fleetctl.traffic import policy
    from migrations_plan.services import abandon

    dropped = serving(make_pool(name="dropped", runtime="rocm"), 32768)
    plan = plan_create(actor=world.lead, name="dropped-plan", candidate_pool=dropped,
                       primary_pool=world.big, routes=[world.route], slo_ttft_p95_ms=450,
                       slo_tpot_p95_ms=80, slo_error_rate=0.02)
    abandon(actor=world.lead, plan=plan, reason="the pool is retired")
    serving(make_pool(name="spare"), 32768)
    route = Route.objects.get(pk=world.route.pk)
    # The pools serving the model; the open plans of them, with their routes; the newest plan
    # of each on the route.
    with django_assert_max_num_queries(4):
        found = tiers.candidates(route)
    assert len(found) == 8
    stages = {c.pool.name: c.refusal for c in found if (c.refusal or "").startswith("stage")}
    assert sorted(stages) == ["cand", "dropped"]
    assert "cand-plan, which is at stage 1" in stages["cand"]
    assert "dropped-plan was abandoned" in stages["dropped"]
    one_by_one = {c.pool.pk: policy.live_weight_refusal(c.pool, route) for c in found}
    assert policy.live_weight_refusals([c.pool for c in found], route) == {
        pk: reason for pk, reason in one_by_one.items() if reason}


def test_the_demo_registry_matches_its_servers_and_llama_8b_has_its_tiers() -> None:
    from tests.fleet.test_demo_seed import seed

    notes = seed()
    assert "tiers" not in notes, notes
    context = dict(PoolModel.objects.values_list("pool__name", "max_context_tokens"))
    assert context == {"h200-us-east": 32768, "mi300x-us-east": 32768,
                       "tpu-v5e-eu-west": 8192, "a100-eu-central": 16384,
                       "gaudi3-in-west": 32768}
    assert dict(Pool.objects.values_list("name", "max_context_tokens")) == context
    views = tiers.route_tier_pools(Route.objects.get(name="llama-8b"))
    assert [(v.tier.max_prompt_tokens, v.tier.behaviour) for v in views] == [
        (8192, "failover"), (32768, "queue"), (None, "reject")]
    # The plans' candidates are kept off by the stage rules; the 32k tier by context.
    assert views[0].eligible_names == ["gaudi3-in-west", "h200-us-east", "tpu-v5e-eu-west"]
    assert views[1].eligible_names == ["gaudi3-in-west", "h200-us-east"]
    assert views[2].refuses_all
