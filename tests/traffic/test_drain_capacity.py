"""Capacity-checked drains (traffic/drain_capacity.py): a drain compares the load the
drained pool carries now with what the primary can still carry within its SLO; short, it
spreads over the route's pools that carry weight (never outside a pinned route's pin), or
steps; `force` moves it
all at once; a missing figure never holds a drain up. Real parts: PostgreSQL, the benchmark
evidence rows capacity is read from, the gateways' traffic samples, the file gateway kind."""

from __future__ import annotations

from pathlib import Path

import pytest
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.fleet import services as fleet_services
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.traffic import push, selectors, services
from fleetctl.traffic.models import Drain, Gateway, GatewayPush, PoolTrafficSample, Route
from migrations_plan import services as plans
from tests.conftest import SYSTEM

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("file_kind")]
MODEL = "llama-3.1-8b-instruct"
BENCH = Actor.for_system("benchmark")
# Streams in flight now, per pool: `cand` (drained) carries 6.
LIVE = {"primary": 8, "spread": 2, "cand": 6, "abroad": 1}


def _bench(pool, *, run: int, streams: int) -> None:
    """Benchmark evidence: the pool held its SLO up to `streams` concurrent streams."""
    plans.evidence_record(
        actor=BENCH, pool=pool, kind="benchmark", verdict="pass", summary=f"run {run}",
        model_id=MODEL, source=f"benchmark run {run}",
        data={"run": run, "timing": "concurrency", "best_concurrency": streams,
              "output_tokens_per_s": 100.0 * streams, "cost_per_1m": None,
              "measured_on": "2026-12-01", "endpoints": 1,
              "slo": {"ttft_p95_ms": 800, "tpot_p95_ms": 60, "error_rate": 0.01}})


class Scene:
    """Route `llama`: primary 40 %, spread 20 %, cand 30 %, abroad 10 % (another
    jurisdiction, the route is not pinned); `idle` may serve it but has no weight."""

    def __init__(self, make_pool, tmp_path: Path) -> None:
        eu = fleet_services.region_create(actor=SYSTEM, code="eu-west", name="EU West",
                                          jurisdiction="DE")
        self.pools = {name: make_pool(name=name) for name in ("primary", "spread", "cand",
                                                               "idle")}
        self.pools["abroad"] = make_pool(name="abroad", region=eu)
        for pool in self.pools.values():
            pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
            pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
        self.route = services.route_create(
            actor=SYSTEM, name="llama", model_id=MODEL, primary_pool=self.pools["primary"],
            weights={"primary": 40, "spread": 20, "cand": 30, "abroad": 10})
        self.gateway = services.gateway_create(
            actor=SYSTEM, name="gw-1", kind="file", admin_address=str(tmp_path),
            options={"file_name": "weights.json"}, routes=[self.route])

    def capacity(self, **streams: int) -> None:
        for run, (name, value) in enumerate(sorted(streams.items()), start=1):
            _bench(self.pools[name], run=run, streams=value)

    def live(self, **override: int) -> None:
        now = timezone.now()
        for pool, active in (LIVE | override).items():
            PoolTrafficSample.objects.create(gateway=self.gateway, pool=pool, active=active,
                                             requests_total=0, errors_total=0, at=now)

    def split(self) -> dict[str, int]:
        route = Route.objects.get(pk=self.route.pk)
        current = selectors.revision_current(route=route)
        return dict(current.weights) if current else {}


@pytest.fixture
def scene(make_pool, tmp_path) -> Scene:
    return Scene(make_pool, tmp_path)


def _drain(scene: Scene, **kwargs) -> Drain:
    drain = services.drain_request(actor=SYSTEM, pool=scene.pools["cand"], reason="incident",
                                   **kwargs)
    return push.drain_push_now(drain)


def test_a_primary_with_room_takes_it_all_at_once(scene):
    scene.capacity(primary=20, spread=10, abroad=10)
    scene.live()
    drain = _drain(scene, stepping=True)
    assert scene.split() == {"primary": 7000, "spread": 2000, "abroad": 1000}
    assert drain.capacity["decision"] == "instant"
    note = drain.capacity["routes"][0]
    assert note["load_streams"] == 6
    primary = note["pools"]["primary"]
    assert (primary["capacity_streams"], primary["live_streams"], primary["room_streams"],
            primary["given_bp"]) == (20.0, 8, 12.0, 3000)
    assert "the primary primary has room" in drain.capacity["why"]
    assert drain.next_step_at is None


def test_a_short_primary_spreads_over_the_pools_carrying_an_unpinned_route(scene,
                                                                           client_for):
    # The primary has room for 2 of the 6 streams, `spread` and `abroad` for 8 each: the route
    # is not pinned and already sends to `abroad`, so its jurisdiction is no reason to skip
    # it. `idle` carries no weight: it gets none.
    scene.capacity(primary=10, spread=10, abroad=9, idle=50)
    scene.live()
    oncall = client_for("on-call")
    answer = oncall.post("/api/v1/drains/", {"pool": "cand", "reason": "incident"},
                         format="json")
    assert answer.status_code == 202, answer.json()
    # 30 % carries 6 streams: 5 % a stream. The primary takes 2 (10 %), the rest goes to
    # spread and abroad in proportion to their room (10 % each).
    assert scene.split() == {"primary": 5000, "spread": 3000, "abroad": 2000}
    body = answer.json()
    assert body["capacity"]["decision"] == "spread"
    pools = body["capacity"]["routes"][0]["pools"]
    assert (pools["primary"]["room_streams"], pools["primary"]["given_bp"]) == (2.0, 1000)
    assert (pools["spread"]["room_streams"], pools["spread"]["given_bp"]) == (8.0, 1000)
    assert (pools["abroad"]["role"], pools["abroad"]["given_bp"]) == ("spread", 1000)
    assert "idle" not in pools
    assert "benchmark run" in pools["primary"]["source"]
    assert oncall.get(f"/api/v1/drains/{body['id']}/").json()["capacity"] == body["capacity"]
    event = AuditEvent.objects.get(action="drain.request", object_id=str(body["id"]))
    assert event.after["capacity"]["decision"] == "spread"
    page = oncall.get(f"/traffic/drains/{body['id']}/").content.decode()
    assert "Capacity check: <span class=\"chip capacity-spread\">spread</span>" in page
    assert "+10 %" in page  # what each target was given


def test_a_pinned_route_never_spreads_outside_its_pin(scene):
    """A pinned route's pools are all in its pin (the services refuse any other); should one
    be found outside it (its region row edited under the registry), a drain gives it nothing."""
    pinned = services.route_create(
        actor=SYSTEM, name="llama-us", model_id=MODEL, residency="US",
        primary_pool=scene.pools["primary"], weights={"primary": 40, "spread": 30, "cand": 30})
    services.gateway_set_routes(actor=SYSTEM, gateway=scene.gateway,
                                routes=[scene.route, pinned])
    Pool.objects.filter(pk=scene.pools["spread"].pk).update(
        region=scene.pools["abroad"].region)
    scene.capacity(primary=8, spread=50)  # full primary; `spread` has room, but abroad
    scene.live()
    drain = push.drain_push_now(services.drain_request(
        actor=SYSTEM, pool=scene.pools["cand"], routes=[pinned], reason="incident"))
    note = drain.capacity["routes"][0]
    assert note["pools"]["spread"]["role"] == "skipped"
    assert note["pools"]["spread"]["why"] in (
        "in jurisdiction DE, outside the route's pin US", "may not serve this route")
    # Nothing crosses the border: a pool outside the pin keeps no weight on the route at all
    # (any new split of a pinned route drops it), and the share goes to the primary.
    current = selectors.revision_current(route=Route.objects.get(pk=pinned.pk))
    assert current is not None and current.weights == {"primary": 10000}

def test_what_nothing_can_carry_moves_in_steps_and_finishes(scene, settings,
                                                            django_capture_on_commit_callbacks):
    settings.DRAIN_STEPS_MAX = 4
    # No room anywhere: the primary and spread are full, abroad has no figure.
    scene.capacity(primary=8, spread=2)
    scene.live()
    drain = _drain(scene, stepping=True)
    assert drain.capacity["decision"] == "stepped"
    # Step 1 of 4 moves a quarter of the 30 % (in proportion to capacity, 8:2).
    assert scene.split() == {"primary": 4600, "spread": 2150, "cand": 2250, "abroad": 1000}
    assert drain.next_step_at is not None
    # Not complete while steps remain, though every gateway holds step 1.
    assert not push.drain_progress(drain_id=drain.pk)
    assert services.drain_step_take(drain_id=drain.pk) is None  # not due yet

    taken = 1
    while drain.next_step_at is not None:
        with django_capture_on_commit_callbacks():  # no worker: the pushes are made below
            assert services.drain_steps_due(now=drain.next_step_at) == 1
        for pending in GatewayPush.objects.filter(status="pending"):
            push.push_execute(push_id=pending.pk)
        drain.refresh_from_db()
        taken += 1
        assert taken <= 4
    assert scene.split().get("cand", 0) == 0
    assert sum(scene.split().values()) == 10_000
    assert scene.split()["abroad"] == 1000  # no figure: never given more
    steps = drain.capacity["steps"]
    assert (steps["done"], len(steps["log"])) == (4, 3)
    assert steps["left_bp"] == {"llama": 0}
    assert drain.revisions.count() == 4
    assert push.drain_progress(drain_id=drain.pk)
    drain.refresh_from_db()
    assert drain.status == Drain.Status.COMPLETE

    # A restore goes back to the split from before the first step.
    restore = services.drain_restore(actor=SYSTEM, drain=drain, reason="over")
    assert scene.split() == {"primary": 4000, "spread": 2000, "cand": 3000, "abroad": 1000}
    assert restore.revisions.count() == 1


def test_an_automatic_drain_never_steps(scene):
    scene.capacity(primary=8, spread=2)
    scene.live()
    drain = _drain(scene)  # as the health policy, a ramp or a plan calls it
    assert scene.split().get("cand", 0) == 0
    assert drain.next_step_at is None
    assert "an automatic drain does not step" in drain.capacity["why"]


def test_force_moves_it_all_to_the_primary_and_says_so(scene, client_for):
    scene.capacity(primary=8, spread=2, abroad=10)
    scene.live()
    answer = client_for("on-call").post("/api/v1/drains/", {
        "pool": "cand", "reason": "on fire", "force": True}, format="json")
    assert answer.status_code == 202, answer.json()
    assert scene.split() == {"primary": 7000, "spread": 2000, "abroad": 1000}
    capacity = answer.json()["capacity"]
    assert capacity["decision"] == "forced"
    assert capacity["why"].startswith("llama: forced: moved at once to the primary")
    assert capacity["routes"][0]["load_streams"] == 6  # the figures are still recorded
    assert answer.json()["next_step_at"] is None


def test_unknown_capacity_drains_at_once_and_says_why(scene):
    scene.capacity(spread=10)  # no benchmark of the primary
    scene.live()
    drain = _drain(scene, stepping=True)
    assert scene.split() == {"primary": 7000, "spread": 2000, "abroad": 1000}
    assert drain.capacity["decision"] == "instant"
    assert drain.capacity["why"].startswith(
        "llama: capacity unknown: primary primary: no benchmark of it")


def test_no_live_sample_drains_at_once_and_says_why(scene):
    scene.capacity(primary=8, spread=2)
    drain = _drain(scene, stepping=True)  # no gateway sample at all
    assert scene.split() == {"primary": 7000, "spread": 2000, "abroad": 1000}
    assert "capacity unknown: no gateway sampled cand's streams" in drain.capacity["why"]


@pytest.mark.parametrize("force", ["yes", 1, "true", None])
def test_force_must_be_a_boolean(scene, client_for, force):
    before = scene.split()
    answer = client_for("on-call").post("/api/v1/drains/", {
        "pool": "cand", "reason": "x", "force": force}, format="json")
    assert answer.status_code == 400
    assert "force" in answer.json()["error"]["fields"]
    assert scene.split() == before
    assert not Drain.objects.exists()


def test_the_dashboard_force_checkbox(scene, client_for):
    scene.capacity(primary=8, spread=2)
    scene.live()
    oncall = client_for("on-call")
    page = oncall.get("/traffic/pools/cand/drain/").content.decode()
    assert 'name="force"' in page
    # The preview is the capacity-checked drain: nothing can carry it, so it would step.
    assert "Capacity check: <strong>stepped</strong>" in page
    assert "cand 22.5 %" in page
    answer = oncall.post("/traffic/pools/cand/drain/", {
        "confirm_name": "cand", "reason": "on fire", "force": "on"})
    assert answer.status_code == 302
    assert Drain.objects.get().capacity["decision"] == "forced"
    assert Gateway.objects.count() == 1


def test_a_restore_stops_a_stepped_drain(scene, django_capture_on_commit_callbacks):
    scene.capacity(primary=8, spread=2)
    scene.live()
    drain = _drain(scene, stepping=True)
    assert drain.capacity["decision"] == "stepped" and drain.next_step_at is not None
    push.drain_push_now(services.drain_restore(actor=SYSTEM, drain=drain, reason="back"))
    assert scene.split() == {"primary": 4000, "spread": 2000, "cand": 3000, "abroad": 1000}
    with django_capture_on_commit_callbacks():
        services.drain_steps_due(now=drain.next_step_at)
    drain.refresh_from_db()
    assert drain.next_step_at is None
    assert drain.capacity["steps"]["stopped"].startswith("restored by restore ")
    assert scene.split()["cand"] == 3000  # the step did not drain it again
