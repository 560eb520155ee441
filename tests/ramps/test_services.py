"""The ramp controller against PostgreSQL, with telemetry written as Window rows: each tick is
called with the time it runs at, so a hold of 30 s takes no 30 s. Gateways are left out here
(the split's revisions and drains are records); tests/ramps/test_envoy_tick.py pushes to a
real Envoy."""

from __future__ import annotations

import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.core.exceptions import ValidationError
from django.db import connection
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.core.errors import ConflictError, PermissionDeniedError
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_health_record, pool_model_create, region_create
from fleetctl.ramps import selectors
from fleetctl.ramps.models import Ramp, RampEvent
from fleetctl.ramps.services import (
    ramp_abort,
    ramp_create,
    ramp_pause,
    ramp_resume,
    ramp_skip,
    ramps_tick,
    split_for,
)
from fleetctl.traffic import selectors as traffic_selectors
from fleetctl.traffic.models import Route
from fleetctl.traffic.services import (
    drain_request,
    drain_restore,
    revision_create,
    route_create,
)
from fleetctl.webhooks.models import Delivery
from fleetctl.webhooks.services import webhook_create
from migrations_plan.models import Evidence, Plan
from migrations_plan.services import plan_create
from tests.conftest import SYSTEM
from tests.ramps.windows import boundary, traffic

MODEL = "llama-3.1-8b-instruct"
THRESHOLDS = {"slo_ttft_p95_ms": 500.0, "slo_tpot_p95_ms": 100.0, "slo_error_rate": 0.05,
              "latency_margin_pct": 10.0}
GOOD = [100.0] * 60  # per 10 s window: 6 requests a second, 100 ms to the first token
SLOW = [400.0] * 60  # the same, 300 ms slower
LEANING = [100.0] * 52 + [600.0] * 5  # its p95 over a 500 ms SLO, its bound not


def _serving(pool: Pool) -> Pool:
    pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
    pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    return pool


@pytest.fixture
def fleet(make_pool):
    prim, cand, other = (_serving(make_pool(name=n)) for n in ("prim", "cand", "other"))
    route = route_create(actor=SYSTEM, name="llama", model_id=MODEL, primary_pool=prim,
                         reason="test")
    return SimpleNamespace(route=route, prim=prim, cand=cand, other=other)


@pytest.fixture
def oncall(make_user):
    return Actor(user=make_user("oncall", "on-call"))


def start(fleet, actor, steps=((5, 30), (50, 30)), pool=None, **overrides):
    return ramp_create(actor=actor, route=fleet.route, pool=pool or fleet.cand,
                       steps=[{"percent": p, "hold_s": h} for p, h in steps],
                       **{**THRESHOLDS, **overrides})


def kinds(ramp, *, quiet=False):
    """The timeline's kinds in order; `quiet` leaves out the routine checks and waits."""
    rows = ramp.events.order_by("id").values_list("kind", flat=True)
    return [k for k in rows if not quiet or k not in ("check", "wait")]


def weights(route):
    return traffic_selectors.revision_current(route=Route.objects.get(pk=route.pk)).weights


def fresh(ramp):
    return Ramp.objects.get(pk=ramp.pk)


@pytest.mark.django_db
class TestController:
    def test_steps_up_hold_by_hold_and_completes(self, fleet, oncall):
        hook = webhook_create(actor=SYSTEM, name="ops", url="http://127.0.0.1:9/hook",
                              events=["ramp.decision"])
        ramp = start(fleet, oncall)
        t0 = boundary(timezone.now())
        assert ramps_tick(now=t0) == 1
        assert weights(fleet.route) == {"prim": 9500, "cand": 500}
        traffic(since=t0, until=t0 + timedelta(seconds=31),
                per_window={"cand": GOOD, "prim": GOOD})
        ramps_tick(now=t0 + timedelta(seconds=31))
        assert weights(fleet.route) == {"prim": 5000, "cand": 5000}
        assert fresh(ramp).step_index == 1
        traffic(since=t0 + timedelta(seconds=40), until=t0 + timedelta(seconds=62),
                per_window={"cand": GOOD, "prim": GOOD})
        ramps_tick(now=t0 + timedelta(seconds=62))
        ramp = fresh(ramp)
        assert ramp.state == "complete" and ramp.finished_at is not None
        assert kinds(ramp, quiet=True) == ["start", "step", "pass", "step", "pass", "complete"]
        passed = ramp.events.filter(kind="pass").first()
        assert passed.numbers["candidate"]["pool"] == "cand"
        assert passed.numbers["primary"]["pool"] == "prim"
        assert passed.numbers["candidate"]["ttft_p95"]["n"] >= 50
        assert "held its SLO" in passed.message
        notified = list(Delivery.objects.filter(webhook=hook).order_by("pk")
                        .values_list("payload", flat=True))
        assert [p["data"]["kind"] for p in notified] == ["step", "pass", "step", "pass",
                                                         "complete"]
        assert "Ramp " in notified[0]["text"] and notified[0]["data"]["ramp"] == ramp.pk
        spans = selectors.ramp_timeline(selectors.ramp_detail(ramp.pk))["spans"]
        assert [(s["percent"], s["outcome"]) for s in spans] == [(5, "passed"),
                                                                  (50, "complete")]
        assert all(s["end"] is not None for s in spans)

    def test_a_drive_that_outlived_its_lease_does_not_judge_the_step_again(self, fleet, oncall):
        """Two controllers on one step (the first one's lease ran out mid-drive, as on a loaded
        machine): the late one reads the ramp before the step moved and drives after. It must
        neither pass the hold a second time nor take the revision the first one set for a
        person's change and pause the ramp."""
        from fleetctl.ramps.services.controller import _drive

        ramp = start(fleet, oncall)
        t0 = boundary(timezone.now())
        ramps_tick(now=t0)
        traffic(since=t0, until=t0 + timedelta(seconds=31),
                per_window={"cand": GOOD, "prim": GOOD})
        late = Ramp.objects.select_related("route__primary_pool", "pool", "plan").get(pk=ramp.pk)
        ramps_tick(now=t0 + timedelta(seconds=31))
        _drive(late, now=t0 + timedelta(seconds=31), owner="late")
        ramp = fresh(ramp)
        assert ramp.state == "running" and ramp.step_index == 1, ramp.state_reason
        assert kinds(ramp, quiet=True) == ["start", "step", "pass", "step"]
        assert weights(fleet.route) == {"prim": 5000, "cand": 5000}

    def test_never_advances_without_data(self, fleet, oncall):
        ramp = start(fleet, oncall)
        t0 = boundary(timezone.now())
        ramps_tick(now=t0)
        ramps_tick(now=t0 + timedelta(seconds=31))
        ramps_tick(now=t0 + timedelta(seconds=33))
        ramp = fresh(ramp)
        assert ramp.state == "running" and ramp.step_index == 0
        waits = ramp.events.filter(kind="wait")
        assert waits.count() == 1  # a WAIT only when the reason changes
        assert "is the ingester running?" in waits.get().message

    def test_waits_on_stale_telemetry(self, fleet, oncall):
        ramp = start(fleet, oncall)
        t0 = boundary(timezone.now())
        ramps_tick(now=t0)
        traffic(since=t0, until=t0 + timedelta(seconds=20),
                per_window={"cand": GOOD, "prim": GOOD})
        ramps_tick(now=t0 + timedelta(seconds=61))
        ramp = fresh(ramp)
        assert ramp.step_index == 0 and ramp.state == "running"
        assert "No telemetry from the gateways since" in ramp.events.get(kind="wait").message

    def test_waits_for_enough_requests(self, fleet, oncall):
        ramp = start(fleet, oncall)
        t0 = boundary(timezone.now())
        ramps_tick(now=t0)
        traffic(since=t0, until=t0 + timedelta(seconds=31),
                per_window={"cand": [100.0] * 5, "prim": GOOD})
        ramps_tick(now=t0 + timedelta(seconds=31))
        ramp = fresh(ramp)
        assert ramp.step_index == 0
        assert "of the 50 requests needed" in ramp.events.filter(kind="wait").last().message

    def test_a_warning_hold_pauses_for_a_person(self, fleet, oncall):
        ramp = start(fleet, oncall)
        t0 = boundary(timezone.now())
        ramps_tick(now=t0)
        traffic(since=t0, until=t0 + timedelta(seconds=31),
                per_window={"cand": LEANING, "prim": GOOD})
        ramps_tick(now=t0 + timedelta(seconds=31))
        ramp = fresh(ramp)
        assert ramp.state == "paused" and ramp.state_reason.startswith("warn:")
        warn = ramp.events.get(kind="warn")
        assert "but its lower bound is not" in warn.message
        assert weights(fleet.route) == {"prim": 9500, "cand": 500}  # nothing rolled back

    def test_failing_checks_roll_back_with_a_drain(self, fleet, oncall):
        ramp = start(fleet, oncall)
        t0 = boundary(timezone.now())
        ramps_tick(now=t0)
        traffic(since=t0, until=t0 + timedelta(seconds=8),
                per_window={"cand": SLOW, "prim": GOOD})
        ramps_tick(now=t0 + timedelta(seconds=5))
        assert fresh(ramp).state == "running" and fresh(ramp).consecutive_failures == 1
        ramps_tick(now=t0 + timedelta(seconds=7))
        ramp = fresh(ramp)
        assert ramp.state == "rolled-back" and ramp.drain is not None
        assert ramp.drain.drained_pools == ["cand"]
        assert weights(fleet.route) == {"prim": 10000}
        assert kinds(ramp, quiet=True) == ["start", "step", "fail", "fail", "rollback"]
        rollback = ramp.events.get(kind="rollback")
        assert rollback.drain_id == ramp.drain_id
        assert rollback.numbers["candidate"]["ttft_p95"]["low"] > 300
        assert "2 of 2 in a row" in ramp.events.filter(kind="fail").last().message
        assert ramp.drain.requested_by == f"system:ramp-{ramp.pk}"

    def test_a_paused_ramp_is_still_judged_and_rolled_back_when_its_pool_fails(
            self, fleet, oncall):
        """A pause keeps the candidate's weight, so the guard keeps judging it: a fault while
        paused rolls back (the failures counted as while running), a healthy pool leaves the
        ramp paused with nothing added to its timeline."""
        ramp = start(fleet, oncall)
        t0 = boundary(timezone.now())
        ramps_tick(now=t0)
        ramp_pause(actor=oncall, ramp=fresh(ramp), reason="looking at a dashboard")
        traffic(since=t0, until=t0 + timedelta(seconds=20),
                per_window={"cand": GOOD, "prim": GOOD})
        ramps_tick(now=t0 + timedelta(seconds=20))
        ramps_tick(now=t0 + timedelta(seconds=21))
        assert fresh(ramp).state == "paused"
        assert kinds(ramp) == ["start", "step", "pause"]
        assert weights(fleet.route) == {"prim": 9500, "cand": 500}

        traffic(since=t0 + timedelta(seconds=30), until=t0 + timedelta(seconds=40),
                per_window={"cand": SLOW, "prim": GOOD})
        ramps_tick(now=t0 + timedelta(seconds=40))
        assert fresh(ramp).state == "paused" and fresh(ramp).consecutive_failures == 1
        ramps_tick(now=t0 + timedelta(seconds=41))
        ramp = fresh(ramp)
        assert ramp.state == "rolled-back" and ramp.drain is not None
        assert weights(fleet.route) == {"prim": 10000}
        assert kinds(ramp) == ["start", "step", "pause", "fail", "fail", "rollback"]
        assert "failed while paused (2 of 2 in a row)" in ramp.state_reason

    def test_a_pool_reporting_an_unregistered_upgrade_holds_its_running_ramps(
            self, fleet, oncall):
        from fleetctl.ramps.services import ramps_hold_for_report

        ramp = start(fleet, oncall)
        ramps_tick(now=boundary(timezone.now()))
        [held] = ramps_hold_for_report(pool_id=fleet.cand.pk,
                                       changes=["server version 0.6.3 → 0.7.0"])
        ramp = fresh(ramp)
        assert held.pk == ramp.pk and ramp.state == "paused"
        assert ramp.state_reason == ("the pool reports server version 0.6.3 → 0.7.0 (nobody "
                                     "registered it): held until it is re-verified")
        assert ramp.events.filter(kind="pause", actor="system:reverify").exists()
        assert ramps_hold_for_report(pool_id=fleet.cand.pk, changes=["again"]) == []

    def test_a_passing_check_resets_the_failure_count(self, fleet, oncall):
        ramp = start(fleet, oncall, steps=((5, 60),))
        t0 = boundary(timezone.now())
        ramps_tick(now=t0)
        traffic(since=t0, until=t0 + timedelta(seconds=10),
                per_window={"cand": SLOW, "prim": GOOD})
        ramps_tick(now=t0 + timedelta(seconds=5))
        traffic(since=t0 + timedelta(seconds=10), until=t0 + timedelta(seconds=50),
                per_window={"cand": GOOD * 4, "prim": GOOD})
        ramps_tick(now=t0 + timedelta(seconds=45))
        assert fresh(ramp).consecutive_failures == 0

    def test_a_manual_change_pauses_and_resume_reapplies_the_step(self, fleet, oncall):
        ramp = start(fleet, oncall)
        t0 = boundary(timezone.now())
        ramps_tick(now=t0)
        route = fresh(ramp).route
        set_by_ramp = route.revision_number
        revision_create(actor=oncall, route=route, weights={"prim": 80, "cand": 20},
                        base_revision=set_by_ramp, reason="by hand")
        ramps_tick(now=t0 + timedelta(seconds=2))
        ramp = fresh(ramp)
        assert ramp.state == "paused"
        change = ramp.events.get(kind="manual-change")
        assert f"revision {set_by_ramp + 1} of llama" in change.message
        assert f"this ramp set (revision {set_by_ramp})" in change.message
        assert "by oncall" in change.message and "cand 20 %" in change.message
        assert weights(fleet.route) == {"prim": 8000, "cand": 2000}  # not fought

        ramp_resume(actor=oncall, ramp=ramp, reason="looked fine")
        ramps_tick(now=t0 + timedelta(seconds=4))
        ramp = fresh(ramp)
        assert ramp.state == "running" and ramp.step_index == 0
        assert ramp.step_started_at == t0 + timedelta(seconds=4)
        assert weights(fleet.route) == {"prim": 9500, "cand": 500}
        assert kinds(ramp, quiet=True)[-3:] == ["manual-change", "resume", "step"]

    def test_skip_steps_up_without_judging(self, fleet, oncall):
        ramp = start(fleet, oncall)
        t0 = boundary(timezone.now())
        ramps_tick(now=t0)
        ramp_skip(actor=oncall, ramp=ramp, reason="seen enough")
        ramps_tick(now=t0 + timedelta(seconds=1))
        ramp = fresh(ramp)
        assert ramp.step_index == 1
        assert kinds(ramp, quiet=True) == ["start", "step", "skip", "step"]
        assert "oncall skipped the hold at 5 %" in ramp.events.get(kind="skip").message

    def test_pause_stops_the_steps_not_the_guard(self, fleet, oncall):
        ramp = start(fleet, oncall)
        t0 = boundary(timezone.now())
        ramps_tick(now=t0)
        ramp_pause(actor=oncall, ramp=ramp, reason="lunch")
        traffic(since=t0, until=t0 + timedelta(seconds=60),
                per_window={"cand": GOOD, "prim": GOOD})
        assert ramps_tick(now=t0 + timedelta(seconds=60)) == 1  # judged, not stepped
        ramp = fresh(ramp)
        assert ramp.state == "paused" and ramp.step_index == 0
        assert weights(fleet.route) == {"prim": 9500, "cand": 500}
        with pytest.raises(ConflictError):
            ramp_pause(actor=oncall, ramp=ramp, reason="again")
        with pytest.raises(ConflictError):
            ramp_skip(actor=oncall, ramp=ramp, reason="paused")

    def test_abort_drains_the_pool_off_the_route(self, fleet, oncall):
        ramp = start(fleet, oncall)
        ramps_tick(now=timezone.now())
        ramp = ramp_abort(actor=oncall, ramp=ramp, reason="pager")
        ramp = fresh(ramp)
        assert ramp.state == "aborted" and ramp.drain is not None
        assert weights(fleet.route) == {"prim": 10000}
        assert ramp.events.get(kind="abort").drain_id == ramp.drain_id
        with pytest.raises(ConflictError):
            ramp_abort(actor=oncall, ramp=ramp, reason="twice")

    def test_a_refused_step_pauses_with_the_reason(self, fleet, oncall):
        ramp = start(fleet, oncall)
        Pool.objects.filter(pk=fleet.cand.pk).update(health_state=Pool.Health.UNHEALTHY)
        ramps_tick(now=timezone.now())
        ramp = fresh(ramp)
        assert ramp.state == "paused"
        assert "unhealthy" in ramp.events.get(kind="pause").message
        assert weights(fleet.route) == {"prim": 10000}

    def test_the_other_pools_keep_their_proportions(self, fleet, oncall):
        revision_create(actor=oncall, route=fleet.route, weights={"prim": 75, "other": 25},
                        base_revision=fleet.route.revision_number, reason="two pools")
        start(fleet, oncall, steps=((10, 30),))
        ramps_tick(now=timezone.now())
        assert weights(fleet.route) == {"prim": 6750, "other": 2250, "cand": 1000}


def test_split_for_sums_to_the_whole_and_the_primary_takes_rounding():
    split = split_for({"p": 3333, "a": 3333, "b": 3334}, candidate="c", primary="p",
                      percent=33.33)
    assert sum(split.values()) == 10_000 and split["c"] == 3333
    assert split_for({"p": 10_000}, candidate="c", primary="p", percent=100) == {"c": 10_000}
    assert split_for({"a": 10_000}, candidate="c", primary="p", percent=1) == {"a": 9900,
                                                                               "c": 100}


@pytest.mark.django_db
class TestCreate:
    def test_stores_a_running_ramp_and_its_start(self, fleet, oncall):
        ramp = start(fleet, oncall, reason="canary")
        assert ramp.state == "running" and ramp.step_index == -1
        assert ramp.revision_number == fleet.route.revision_number
        assert ramp.base_weights == {"prim": 10000}
        assert kinds(ramp) == ["start"] and "canary" in ramp.events.get().message

    def test_a_second_active_ramp_is_refused_naming_the_first(self, fleet, oncall):
        first = start(fleet, oncall)
        with pytest.raises(ConflictError) as refused:
            start(fleet, oncall, pool=fleet.other)
        assert f"ramp {first.pk} of cand" in refused.value.message
        assert Ramp.objects.count() == 1

    @pytest.mark.parametrize(("steps", "says"), [
        (((5, 30), (5, 30)), "must strictly increase"),
        (((10, 30), (5, 30)), "must strictly increase"),
        (((0, 30),), "above 0 and at most 100"),
        (((101, 30),), "above 0 and at most 100"),
        (((5.001, 30),), "finer than the 0.01 % step"),
        (((5, 20),), "hold_s must be at least 30 s"),
        (tuple((i + 1, 30) for i in range(21)), "at most 20"),
    ])
    def test_bad_steps_are_refused_and_nothing_stored(self, fleet, oncall, steps, says):
        with pytest.raises(ValidationError) as refused:
            start(fleet, oncall, steps=steps)
        assert says in " ".join(refused.value.message_dict["steps"])
        assert not Ramp.objects.exists() and not RampEvent.objects.exists()

    def test_a_hold_shorter_than_a_telemetry_window(self, fleet, oncall):
        with pytest.raises(ValidationError) as refused:
            start(fleet, oncall, steps=((5, 5),), window_s=10)
        assert "one telemetry window of 10 s" in refused.value.message_dict["steps"][0]

    def test_residency(self, fleet, oncall, make_pool):
        eu = _serving(make_pool(name="eu-pool", region=region_create(
            actor=SYSTEM, code="eu-west", name="EU West", jurisdiction="EU")))
        pinned = route_create(actor=SYSTEM, name="llama-us", model_id=MODEL,
                              primary_pool=fleet.prim, residency="US", reason="test")
        with pytest.raises(ValidationError) as refused:
            ramp_create(actor=oncall, route=pinned, pool=eu, steps=[{"percent": 5,
                                                                     "hold_s": 30}],
                        **THRESHOLDS)
        assert refused.value.message_dict["pool"][0].startswith("Residency: pool eu-pool")
        assert not Ramp.objects.exists()

    def test_the_primary_and_pools_off_the_model_are_refused(self, fleet, oncall, make_pool):
        with pytest.raises(ValidationError, match="primary"):
            start(fleet, oncall, pool=fleet.prim)
        with pytest.raises(ValidationError, match="does not serve model"):
            start(fleet, oncall, pool=make_pool(name="bare"))

    def test_thresholds_are_required_without_a_plan(self, fleet, oncall):
        with pytest.raises(ValidationError) as refused:
            ramp_create(actor=oncall, route=fleet.route, pool=fleet.cand,
                        steps=[{"percent": 5, "hold_s": 30}], slo_ttft_p95_ms=500)
        text = refused.value.message_dict["non_field_errors"][0]
        assert "slo_tpot_p95_ms, slo_error_rate" in text and "slo_ttft_p95_ms" not in text

    def test_a_step_below_the_pools_current_weight(self, fleet, oncall):
        revision_create(actor=oncall, route=fleet.route, weights={"prim": 90, "cand": 10},
                        base_revision=fleet.route.revision_number, reason="by hand")
        with pytest.raises(ValidationError) as refused:
            start(fleet, oncall, steps=((5, 30), (20, 30)))
        assert "already carries 10 %" in refused.value.message_dict["steps"][0]

    def test_needs_the_ramp_permission(self, fleet, make_user):
        viewer = Actor(user=make_user("viewer", "viewer"))
        with pytest.raises(PermissionDeniedError):
            start(fleet, viewer)


@pytest.fixture
def plan(fleet, make_user):
    lead = Actor(user=make_user("lead", "platform-lead"))
    return plan_create(actor=lead, name="cand-plan", candidate_pool=fleet.cand,
                       primary_pool=fleet.prim, routes=[fleet.route], slo_ttft_p95_ms=450,
                       slo_tpot_p95_ms=80, slo_error_rate=0.02)


@pytest.mark.django_db
class TestPlans:
    def test_a_candidate_below_stage_4_is_refused(self, fleet, oncall, plan):
        with pytest.raises(ValidationError) as refused:
            start(fleet, oncall)
        assert "live weight needs stage 4" in refused.value.message_dict["pool"][0]
        with pytest.raises(ValidationError, match="needs stage 4"):
            start(fleet, oncall, plan=plan)

    def test_a_plan_for_another_candidate_is_refused(self, fleet, oncall, plan):
        with pytest.raises(ValidationError) as refused:
            start(fleet, oncall, pool=fleet.other, plan=plan)
        assert "candidate is cand, not other" in refused.value.message_dict["plan"][0]

    def test_a_plans_whole_answer_slo_reaches_its_ramps_guard(self, fleet, oncall, plan):
        """A route whose callers do not stream is guarded on whole answers when the plan says
        how long one may take; a ramp may state its own, and a nonsense one is refused."""
        from fleetctl.ramps.services import thresholds_of

        Plan.objects.filter(pk=plan.pk).update(state=Plan.State.STAGE_4, stage=4,
                                               slo_e2e_p95_ms=2500)
        with pytest.raises(ValidationError) as refused:
            ramp_create(actor=oncall, route=fleet.route, pool=fleet.cand,
                        steps=[{"percent": 5, "hold_s": 30}], slo_e2e_p95_ms=0)
        assert "leave it out to judge no whole-answer latency" in \
            refused.value.message_dict["slo_e2e_p95_ms"][0]
        ramp = ramp_create(actor=oncall, route=fleet.route, pool=fleet.cand,
                           steps=[{"percent": 5, "hold_s": 30}])
        assert ramp.slo_e2e_p95_ms == 2500
        assert thresholds_of(ramp).slo_e2e_p95_ms == 2500

    def test_stage_4_plan_gives_thresholds_and_gets_evidence(self, fleet, oncall, plan):
        Plan.objects.filter(pk=plan.pk).update(state=Plan.State.STAGE_4, stage=4)
        ramp = ramp_create(actor=oncall, route=fleet.route, pool=fleet.cand,
                           steps=[{"percent": 5, "hold_s": 30}])
        assert ramp.plan_id == plan.pk and ramp.slo_ttft_p95_ms == 450
        assert ramp.latency_margin_pct == 10 and ramp.slo_e2e_p95_ms is None  # none stated
        t0 = boundary(timezone.now())
        ramps_tick(now=t0)
        traffic(since=t0, until=t0 + timedelta(seconds=31),
                per_window={"cand": GOOD, "prim": GOOD})
        ramps_tick(now=t0 + timedelta(seconds=31))
        evidence = Evidence.objects.get(kind="ramp-slo")
        assert evidence.verdict == "pass" and evidence.pool_id == fleet.cand.pk
        assert evidence.data["ramp"] == ramp.pk and evidence.data["step"] == 0
        assert evidence.data["steps_total"] == 1 and evidence.data["percent"] == 5
        assert fresh(ramp).events.get(kind="pass").evidence_id == evidence.pk


@pytest.mark.django_db
class TestLease:
    def test_a_held_lease_is_left_and_an_expired_one_taken_over(self, fleet, oncall):
        ramp = start(fleet, oncall)
        now = timezone.now()
        Ramp.objects.filter(pk=ramp.pk).update(lease_owner="worker-that-died",
                                               lease_until=now + timedelta(seconds=10))
        assert ramps_tick(now=now) == 0
        assert ramps_tick(now=now + timedelta(seconds=11), owner="next") == 1
        ramp = fresh(ramp)
        assert ramp.step_index == 0 and ramp.lease_owner == "" and ramp.lease_until is None

    def test_a_failing_tick_is_recorded_and_released(self, fleet, oncall, monkeypatch):
        ramp = start(fleet, oncall)
        from fleetctl.ramps.services import controller

        def broken(*args, **kwargs):
            raise RuntimeError("telemetry database gone")

        monkeypatch.setattr(controller, "_step", broken)
        assert ramps_tick(now=timezone.now()) == 1
        ramp = fresh(ramp)
        assert "telemetry database gone" in ramp.events.get(kind="error").message
        assert ramp.state == "running" and ramp.lease_until is None


@pytest.mark.django_db(transaction=True)
def test_two_concurrent_ticks_drive_a_ramp_once(fleet, oncall, monkeypatch):
    from fleetctl.ramps.services import people

    # The worker of other tests must not take the ramp before the two threads race for it.
    monkeypatch.setattr(people, "_queue_run", lambda pk: None)
    ramp = start(fleet, oncall)
    now = timezone.now()
    barrier = threading.Barrier(2)
    driven: list[int] = []

    def tick(owner: str) -> None:
        try:
            barrier.wait()
            driven.append(ramps_tick(now=now, owner=owner))
        finally:
            connection.close()

    threads = [threading.Thread(target=tick, args=(f"t{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(driven) == [0, 1]
    assert fresh(ramp).events.filter(kind="step").count() == 1
    assert fresh(ramp).revision_number == fleet.route.revision_number + 1


@pytest.mark.django_db
def test_selectors_show_the_active_ramp_and_its_numbers_now(fleet, oncall):
    ramp = start(fleet, oncall)
    assert selectors.ramp_active_for(fleet.route).pk == ramp.pk
    assert selectors.ramp_numbers_now(fresh(ramp)) is None  # no step holding yet
    now = timezone.now()
    ramps_tick(now=now)
    # The step was set 30 s ago: the guard reads only windows that began after it did.
    Ramp.objects.filter(pk=ramp.pk).update(step_started_at=now - timedelta(seconds=30))
    traffic(since=now - timedelta(seconds=20), until=now + timedelta(seconds=1),
            per_window={"cand": GOOD, "prim": GOOD})
    numbers = selectors.ramp_numbers_now(fresh(ramp))
    assert numbers["decision"] == "pass"
    assert numbers["candidate"]["requests"] >= 50 and numbers["primary"]["pool"] == "prim"
    assert list(selectors.ramp_list().filter(state="running")) == [fresh(ramp)]
    detail = selectors.ramp_detail(ramp.pk)
    assert [e.kind for e in detail.events.all()] == ["start", "step"]
    ramp_abort(actor=oncall, ramp=ramp, reason="done")
    assert selectors.ramp_active_for(fleet.route) is None


@pytest.mark.django_db
def test_a_step_is_never_judged_on_windows_that_began_before_it(fleet, oncall):
    """Telemetry is kept in whole 10 s windows: one that began before the step holds the
    previous split's requests (here: a fault the candidate had then), so the guard starts at
    the first window boundary after the step was set."""
    from fleetctl.ramps.services import step_data_start

    ramp = start(fleet, oncall)
    t0 = boundary(timezone.now()) + timedelta(seconds=3)  # 3 s into a window
    ramps_tick(now=t0)
    ramp = fresh(ramp)
    assert ramp.step_started_at == t0
    assert step_data_start(t0) == t0 + timedelta(seconds=7)
    assert step_data_start(t0 - timedelta(seconds=3)) == t0 - timedelta(seconds=3)
    # Bad first tokens in the window the step began in; good ones after.
    traffic(since=t0, until=t0 + timedelta(seconds=1),
            per_window={"cand": [900.0] * 60, "prim": GOOD})
    traffic(since=t0 + timedelta(seconds=7), until=t0 + timedelta(seconds=27),
            per_window={"cand": GOOD, "prim": GOOD})
    judged = selectors.ramp_judgement(ramp, fleet.route, since=t0,
                                      now=t0 + timedelta(seconds=27))
    assert judged.decision == "pass", judged.reasons
    assert judged.numbers["candidate"]["since"] == (t0 + timedelta(seconds=7)).isoformat()


# --- a drain of the pool a ramp holds ends the ramp; its restore does not hand the share back ---

def _paused_at_50(fleet, oncall):
    ramp = start(fleet, oncall, steps=((50, 30),))
    ramps_tick(now=boundary(timezone.now()))
    ramp_pause(actor=oncall, ramp=ramp, reason="looking at a graph")
    assert weights(fleet.route)["cand"] == 5000
    return fresh(ramp)


@pytest.mark.django_db
class TestDrainOfARampsPool:
    def test_draining_the_pool_of_a_paused_ramp_aborts_it_and_the_restore_keeps_it_off(
            self, fleet, oncall):
        ramp = _paused_at_50(fleet, oncall)

        drain = drain_request(actor=oncall, pool=fleet.cand, reason="cand is flaky")

        ramp = fresh(ramp)
        assert (ramp.state, ramp.drain_id) == ("aborted", drain.pk)
        assert ramp.state_reason == f"aborted by drain {drain.pk} (oncall): cand is flaky"
        abort = ramp.events.get(kind="abort")
        assert abort.drain_id == drain.pk and abort.actor == "oncall"
        assert abort.message.startswith(f"Aborted by drain {drain.pk}, which oncall requested")
        assert AuditEvent.objects.filter(action="ramp.abort", object_id=str(ramp.pk),
                                         after__drain=drain.pk).count() == 1
        assert weights(fleet.route) == {"prim": 10000}
        assert ramps_tick(now=timezone.now() + timedelta(seconds=60), only=ramp.pk) == 0

        with pytest.raises(ConflictError, match=r"Nothing to restore: cand's share of route "
                                                r"llama was held by ramp \d+ \(aborted at 50 % "):
            drain_restore(actor=oncall, drain=drain, reason="cand is fine again")
        assert weights(fleet.route) == {"prim": 10000}

    def test_a_running_ramp_is_aborted_too_and_never_steps_the_pool_back_up(self, fleet, oncall):
        ramp = start(fleet, oncall)
        t0 = boundary(timezone.now())
        ramps_tick(now=t0)

        drain_request(actor=oncall, route=fleet.route, reason="everything to the primary")

        assert fresh(ramp).state == "aborted"
        traffic(since=t0, until=t0 + timedelta(seconds=31),
                per_window={"cand": GOOD, "prim": GOOD})
        ramps_tick(now=t0 + timedelta(seconds=31))
        assert weights(fleet.route) == {"prim": 10000}

    def test_the_restore_gives_back_every_share_but_the_ramps(self, fleet, oncall):
        revision_create(actor=oncall, route=fleet.route, weights={"prim": 90, "other": 10},
                        base_revision=1, reason="other takes a little")
        ramp = _paused_at_50(fleet, oncall)
        second = route_create(actor=SYSTEM, name="llama-batch", model_id=MODEL,
                              primary_pool=fleet.prim, weights={"prim": 80, "cand": 20},
                              latency_class="batch", reason="test")
        assert weights(fleet.route) == {"prim": 4500, "cand": 5000, "other": 500}

        route_drain = drain_request(actor=oncall, route=fleet.route, reason="incident")
        pool_drain = drain_request(actor=oncall, pool=fleet.cand, reason="cand everywhere")
        assert fresh(ramp).drain_id == route_drain.pk
        restored = drain_restore(actor=oncall, drain=route_drain, reason="over")

        # llama: other's share is back, cand's stays with the primary.
        assert weights(fleet.route) == {"prim": 9500, "other": 500}
        assert [str(h) for h in restored.withheld] == [
            f"ramp {ramp.pk} (aborted at 50 % (drain {route_drain.pk}))"]
        # llama-batch had no ramp: the pool drain's restore gives cand its 20 % back.
        drain_restore(actor=oncall, drain=pool_drain, reason="over")
        assert weights(second) == {"prim": 8000, "cand": 2000}

    def test_the_restore_of_a_ramps_own_abort_does_not_hand_its_share_back(self, fleet, oncall):
        ramp = _paused_at_50(fleet, oncall)
        ramp = fresh(ramp_abort(actor=oncall, ramp=ramp, reason="pager"))
        assert ramp.events.filter(kind="abort").count() == 1
        assert ramp.state_reason == "pager"

        with pytest.raises(ConflictError, match="Nothing to restore"):
            drain_restore(actor=oncall, drain=ramp.drain, reason="undo")

    def test_a_drain_of_another_pool_leaves_the_ramp_alone(self, fleet, oncall):
        revision_create(actor=oncall, route=fleet.route, weights={"prim": 90, "other": 10},
                        base_revision=1, reason="other takes a little")
        ramp = _paused_at_50(fleet, oncall)

        drain_request(actor=oncall, pool=fleet.other, reason="other is slow")

        assert fresh(ramp).state == "paused"
