"""The standing live watch against PostgreSQL, telemetry written as Window rows (as the
ingester writes them) and every tick called with the time it runs at: a completed ramp hands
over to a watch of each pool carrying weight; the watch judges whole windows with the ramp
guard's judgement, drains (or alerts) only after `failure_threshold` failing windows in a row,
never on insufficient data; `watch.held` measures the span held from the rows on a moving
clock; the REST API and the dashboard. End to end through Envoy: test_e2e_watch.py."""

from __future__ import annotations

import math
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.ramps.models import Watch, WatchVerdict
from fleetctl.ramps.services import ramp_create, ramps_tick, watch_set_policy, watch_tick
from fleetctl.ramps.watch_rule import RULE, held_span
from fleetctl.traffic import selectors as traffic_selectors
from fleetctl.traffic.models import Drain, Route
from fleetctl.traffic.services import route_create
from fleetctl.webhooks.models import Delivery
from fleetctl.webhooks.services import webhook_create
from migrations_plan import evidence as ev
from tests.conftest import SYSTEM
from tests.ramps.watch_aa import run_aa
from tests.ramps.windows import boundary, traffic

pytestmark = pytest.mark.django_db
MODEL = "llama-3.1-8b-instruct"
THRESHOLDS: dict[str, Any] = {"slo_ttft_p95_ms": 500.0, "slo_tpot_p95_ms": 100.0,
                              "slo_error_rate": 0.05, "latency_margin_pct": 10.0}
GOOD = [100.0] * 60
SLOW = [700.0] * 60  # over the 500 ms SLO, bound and all


def _serving(pool: Pool) -> Pool:
    pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
    pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    return pool


@pytest.fixture
def fleet(make_pool, make_user):
    prim, cand = (_serving(make_pool(name=n)) for n in ("prim", "cand"))
    route = route_create(actor=SYSTEM, name="llama", model_id=MODEL, primary_pool=prim,
                         reason="test")
    oncall = Actor(user=make_user("oncall", "on-call"))
    return SimpleNamespace(route=route, prim=prim, cand=cand, oncall=oncall)


def complete_ramp(fleet):
    """A one-step ramp to 50 %, held 30 s on good windows, completed; returns (ramp, when)."""
    ramp = ramp_create(actor=fleet.oncall, route=fleet.route, pool=fleet.cand,
                       steps=[{"percent": 50, "hold_s": 30}], **THRESHOLDS)
    t0 = boundary(timezone.now())
    ramps_tick(now=t0)
    traffic(since=t0, until=t0 + timedelta(seconds=31), per_window={"cand": GOOD, "prim": GOOD})
    done = t0 + timedelta(seconds=31)
    ramps_tick(now=done)
    ramp.refresh_from_db()
    assert ramp.state == "complete"
    return ramp, done


def weights(route):
    revision = traffic_selectors.revision_current(route=Route.objects.get(pk=route.pk))
    assert revision is not None
    return revision.weights


def judge_next(watch, *, cand, prim=GOOD, start):
    """Windows for [start, start + 30 s) and the tick that judges them (one telemetry window
    after they close). Returns the new verdict (or None) and the next window's start."""
    end = start + timedelta(seconds=30)
    traffic(since=start, until=end, per_window={"cand": cand, "prim": prim} if cand else
            {"prim": prim})
    watch_tick(now=end + timedelta(seconds=10))
    return (WatchVerdict.objects.filter(watch=watch, window_start=start).first(), end)


def first_window(watch):
    start = watch.started_at
    epoch = start.timestamp()
    aligned = math.ceil(epoch / 30) * 30
    return start + timedelta(seconds=aligned - epoch)


class TestHandOver:
    def test_a_completed_ramp_hands_over_to_a_watch_of_each_pool_carrying_weight(self, fleet):
        ramp, done = complete_ramp(fleet)

        watches = {w.pool.name: w for w in Watch.objects.filter(route=fleet.route)}
        assert set(watches) == {"cand", "prim"}
        cand, prim = watches["cand"], watches["prim"]
        assert (cand.role, cand.policy, cand.state) == ("candidate", "drain", "active")
        assert (prim.role, prim.policy) == ("primary", "alert")
        assert cand.ramp_id == ramp.pk and cand.started_at == done
        assert cand.slo_ttft_p95_ms == 500.0 and cand.failure_threshold == ramp.failure_threshold
        assert cand.created_by == "system:ramp-guard"
        assert AuditEvent.objects.filter(action="watch.start", actor="system:ramp-guard"
                                         ).count() == 2


class TestJudgement:
    def test_two_failing_windows_in_a_row_drain_the_pool_by_policy(self, fleet):
        hook = webhook_create(actor=SYSTEM, name="ops", url="http://127.0.0.1:9/hook",
                              events=["watch.failed"])
        complete_ramp(fleet)
        watch = Watch.objects.get(pool=fleet.cand)
        start = first_window(watch)

        verdict, start = judge_next(watch, cand=GOOD, start=start)
        assert verdict.verdict == "pass" and verdict.requests >= 50
        assert verdict.ttft_p95_ms is not None and verdict.primary_ttft_p95_ms is not None
        # A tick with nothing new to judge judges nothing.
        assert watch_tick(now=start + timedelta(seconds=15)) == 0

        verdict, start = judge_next(watch, cand=SLOW, start=start)
        assert (verdict.verdict, verdict.action) == ("fail", "counted")
        assert "1 of 2 in a row" in verdict.summary
        watch.refresh_from_db()
        assert watch.state == "active" and weights(fleet.route).get("cand")

        verdict, start = judge_next(watch, cand=SLOW, start=start)
        assert (verdict.verdict, verdict.action) == ("fail", "drained")
        watch.refresh_from_db()
        assert watch.state == "ended" and watch.drain is not None
        assert watch.drain.requested_by == "system:live-watch"
        assert "cand" not in weights(fleet.route)
        assert AuditEvent.objects.filter(action="watch.drain", actor="system:live-watch").exists()
        sent = Delivery.objects.get(webhook=hook)
        assert sent.event == "watch.failed" and sent.payload["data"]["drain"] == watch.drain_id
        # Ended: no more verdicts (the primary's watch carries on).
        traffic(since=start, until=start + timedelta(seconds=30), per_window={"prim": GOOD})
        watch_tick(now=start + timedelta(seconds=40))
        assert WatchVerdict.objects.filter(watch=watch).count() == 3
        assert WatchVerdict.objects.get(watch__pool=fleet.prim, window_start=start).verdict \
            == "pass"

    def test_alert_policy_notifies_and_the_watch_carries_on(self, fleet):
        hook = webhook_create(actor=SYSTEM, name="ops", url="http://127.0.0.1:9/hook",
                              events=["watch.failed"])
        complete_ramp(fleet)
        watch = Watch.objects.get(pool=fleet.cand)
        watch_set_policy(actor=fleet.oncall, watch=watch, policy="alert", reason="we look")
        start = first_window(watch)
        for _ in range(3):
            _, start = judge_next(watch, cand=SLOW, start=start)
        actions = list(WatchVerdict.objects.filter(watch=watch).order_by("window_start")
                       .values_list("action", flat=True))
        assert actions == ["counted", "alerted", "counted"]  # one alert per failing streak
        watch.refresh_from_db()
        assert watch.state == "active" and weights(fleet.route).get("cand")
        assert Delivery.objects.filter(webhook=hook).count() == 1
        assert AuditEvent.objects.filter(action="watch.alert").count() == 1
        assert not Drain.objects.exists()

    def test_single_failing_windows_between_passes_never_drain(self, fleet):
        complete_ramp(fleet)
        watch = Watch.objects.get(pool=fleet.cand)
        start = first_window(watch)
        seen = []
        for cand in (SLOW, GOOD, SLOW, GOOD, None, None, SLOW, GOOD):
            verdict, start = judge_next(watch, cand=cand, start=start)
            seen.append(verdict.verdict)
        assert seen == ["fail", "pass", "fail", "pass", "insufficient", "insufficient",
                        "fail", "pass"]
        watch.refresh_from_db()
        assert watch.state == "active" and not Drain.objects.exists()

    def test_insufficient_data_between_two_fails_does_not_reset_the_count(self, fleet):
        """The ramp guard's rule: a window with nothing to judge knows nothing, so a fail,
        then no data, then a fail are two failing windows in a row."""
        complete_ramp(fleet)
        watch = Watch.objects.get(pool=fleet.cand)
        start = first_window(watch)
        for cand in (SLOW, None, SLOW):
            verdict, start = judge_next(watch, cand=cand, start=start)
        assert verdict.action == "drained"

    def test_insufficient_data_alone_never_drains(self, fleet):
        complete_ramp(fleet)
        watch = Watch.objects.get(pool=fleet.cand)
        start = first_window(watch)
        for _ in range(10):
            verdict, start = judge_next(watch, cand=[700.0] * 5, start=start)  # too few
            assert verdict.verdict == "insufficient"
        watch.refresh_from_db()
        assert watch.state == "active" and watch.consecutive_failures == 0

    def test_aa_twins_with_noise_over_many_windows_never_drain(self, fleet):
        """Two hours of twin telemetry (tests/ramps/watch_aa.py): 10-s windows, 8 requests a
        second each, one lognormal for both pools and a load factor per pool and window."""
        complete_ramp(fleet)
        watch = Watch.objects.get(pool=fleet.cand)
        out = run_aa(watch, start=first_window(watch), hours=2)
        assert out["judged"] == 240
        fails = WatchVerdict.objects.filter(watch=watch, verdict="fail").first()
        assert out["state"] == "active" and not out["drained"], fails and fails.summary
        assert not Drain.objects.exists()
        assert out["verdicts"].get("pass", 0) >= 230, out


# --- watch.held ------------------------------------------------------------------------------

DAY = 86400


@pytest.fixture
def plan(fleet, make_user):
    from migrations_plan.services import plan_create

    return plan_create(actor=Actor(user=make_user("lead", "platform-lead")), name="move",
                       primary_pool=fleet.prim, candidate_pool=fleet.cand,
                       routes=[fleet.route], slo_ttft_p95_ms=500, slo_tpot_p95_ms=100,
                       slo_error_rate=0.05)


def watch_for(fleet, started_at, window_s=600):
    return Watch.objects.create(route=fleet.route, pool=fleet.cand, created_by="test",
                                started_at=started_at, window_s=window_s, **THRESHOLDS)


def rows(watch, since, until, verdict="pass"):
    span = timedelta(seconds=watch.window_s)
    made, t = [], since
    while t + span <= until:
        made.append(WatchVerdict(watch=watch, window_start=t, window_end=t + span,
                                 verdict=verdict, summary=verdict))
        t += span
    WatchVerdict.objects.bulk_create(made)


def held(plan, fleet, now, **params):
    ctx = ev.RuleContext(plan=plan, candidate=fleet.cand, primary=fleet.prim,
                         routes=[fleet.route], now=now)
    return RULE.evaluate(ctx, RULE.clean_params(params))


class TestHeldRule:
    def test_seven_days_on_a_moving_clock(self, fleet, plan):
        t0 = boundary(timezone.now())
        result = held(plan, fleet, t0)
        assert result.status == ev.INSUFFICIENT and "No standing watch" in result.summary
        watch = watch_for(fleet, t0)
        rows(watch, t0, t0 + timedelta(days=3.25))
        result = held(plan, fleet, t0 + timedelta(days=3.25, minutes=5))
        assert result.status == ev.INSUFFICIENT
        assert "3.2 of 7 days" in result.summary and "no failed window" in result.summary
        assert result.numbers["routes"]["llama"]["windows"] == int(3.25 * DAY / 600)
        rows(watch, t0 + timedelta(days=3.25), t0 + timedelta(days=7))
        # 7 days of rows, but read a day later: the watch stopped judging (stale).
        result = held(plan, fleet, t0 + timedelta(days=8))
        assert result.status == ev.INSUFFICIENT and "not judged for" in result.summary
        result = held(plan, fleet, t0 + timedelta(days=7, minutes=1))
        assert result.status == ev.PASS, result.summary
        assert "7.0 days" in result.summary
        assert result.evidence[0].ref == f"watch:{watch.pk}"
        # A day more of passing windows: the same evidence (an approval bound to it holds).
        rows(watch, t0 + timedelta(days=7), t0 + timedelta(days=8))
        later = held(plan, fleet, t0 + timedelta(days=8))
        assert later.status == ev.PASS and later.evidence[0].version == result.evidence[0].version

    def test_a_failed_window_fails_it_and_the_span_restarts_after_it(self, fleet, plan):
        t0 = boundary(timezone.now())
        watch = watch_for(fleet, t0)
        rows(watch, t0, t0 + timedelta(days=5))
        rows(watch, t0 + timedelta(days=5), t0 + timedelta(days=5, seconds=600), "fail")
        rows(watch, t0 + timedelta(days=5, seconds=600), t0 + timedelta(days=9))
        result = held(plan, fleet, t0 + timedelta(days=9))
        assert result.status == ev.FAIL and "a window failed at" in result.summary
        # Seven days after the failed window, it holds again.
        rows(watch, t0 + timedelta(days=9), t0 + timedelta(days=12, seconds=1200))
        result = held(plan, fleet, t0 + timedelta(days=12, seconds=1200))
        assert result.status == ev.PASS, result.summary

    def test_a_gap_longer_than_the_allowed_windows_breaks_the_span(self, fleet, plan):
        t0 = boundary(timezone.now())
        watch = watch_for(fleet, t0)
        rows(watch, t0, t0 + timedelta(days=4))
        rows(watch, t0 + timedelta(days=4), t0 + timedelta(days=4, hours=2), "insufficient")
        rows(watch, t0 + timedelta(days=4, hours=2), t0 + timedelta(days=7, hours=1))
        result = held(plan, fleet, t0 + timedelta(days=7, hours=1))
        assert result.status == ev.INSUFFICIENT and "2.9 of 7 days" in result.summary
        # The same history with a 3-hour allowance holds for the whole span.
        result = held(plan, fleet, t0 + timedelta(days=7, hours=1), max_gap_windows=18)
        assert result.status == ev.PASS, result.summary

    def test_held_span_counts_warnings_without_breaking_the_span(self):
        t0 = boundary(timezone.now())
        span = [(t0 + timedelta(seconds=60 * i), t0 + timedelta(seconds=60 * (i + 1)),
                 "warn" if i == 3 else "pass") for i in range(10)]
        out = held_span(span, now=t0 + timedelta(seconds=600), max_gap_s=180)
        assert out["seconds"] == 600 and out["warned"] == 1 and out["failed_at"] is None

    def test_migration_0011_adds_the_check_to_open_plans_once(self, plan):
        import importlib

        from django.apps import apps as django_apps

        migration = importlib.import_module("migrations_plan.migrations.0011_watch_held_check")
        plan.checks.filter(key="watch-held").delete()  # as before 0011
        migration.forwards(django_apps, None)
        migration.forwards(django_apps, None)
        added = plan.checks.filter(stage=4, key="watch-held", removed_at__isnull=True)
        assert added.count() == 1 and added.get().rule == "watch.held"
        assert added.get().position > plan.checks.get(stage=4, key="healthy").position
        migration.backwards(django_apps, None)
        assert not plan.checks.filter(key="watch-held").exists()

    def test_stage_four_of_a_new_plan_asks_for_it(self, plan):
        check = plan.checks.get(stage=4, key="watch-held")
        assert (check.rule, check.params) == ("watch.held", {"min_days": 7})
        assert check.title == "Per-pool percentiles held for 7 days"


# --- REST and the dashboard ------------------------------------------------------------------

class TestApiAndPages:
    def test_list_detail_policy_and_end(self, fleet, client_for):
        complete_ramp(fleet)
        watch = Watch.objects.get(pool=fleet.cand)
        judge_next(watch, cand=GOOD, start=first_window(watch))
        api = client_for("on-call")
        listed = api.get("/api/v1/watches/?pool=cand")
        assert listed.status_code == 200, listed.content
        assert [w["pool"] for w in listed.json()["results"]] == ["cand"]
        detail = api.get(f"/api/v1/watches/{watch.pk}/").json()
        assert detail["policy"] == "drain" and detail["verdicts"][0]["verdict"] == "pass"

        bad = api.patch(f"/api/v1/watches/{watch.pk}/", {"policy": "page-me"}, format="json")
        assert bad.status_code == 400 and "policy" in bad.json()["error"]["fields"], bad.content
        assert Watch.objects.get(pk=watch.pk).policy == "drain"
        viewer = client_for("viewer")
        denied = viewer.patch(f"/api/v1/watches/{watch.pk}/", {"policy": "alert"},
                              format="json")
        assert denied.status_code == 403
        changed = api.patch(f"/api/v1/watches/{watch.pk}/", {"policy": "alert",
                                                              "reason": "quiet week"},
                            format="json")
        assert changed.status_code == 200 and changed.json()["policy"] == "alert"
        assert AuditEvent.objects.filter(action="watch.policy").exists()

        no_reason = api.post(f"/api/v1/watches/{watch.pk}/end/", {}, format="json")
        assert no_reason.status_code == 400 and "reason" in no_reason.json()["error"]["fields"]
        ended = api.post(f"/api/v1/watches/{watch.pk}/end/", {"reason": "moving on"},
                         format="json")
        assert ended.status_code == 200 and ended.json()["state"] == "ended"
        again = api.post(f"/api/v1/watches/{watch.pk}/end/", {"reason": "twice"},
                         format="json")
        assert again.status_code == 409
        assert api.get("/api/v1/watches/99999/").status_code == 404

    def test_route_page_shows_the_watch_and_the_watch_page_changes_its_policy(
            self, fleet, client):
        from django.contrib.auth import get_user_model

        complete_ramp(fleet)
        watch = Watch.objects.get(pool=fleet.cand)
        judge_next(watch, cand=GOOD, start=first_window(watch))
        client.force_login(get_user_model().objects.get(username="oncall"))
        page = client.get(f"/traffic/routes/{fleet.route.name}/").content.decode()
        assert "Standing watch" in page and f"/ramps/watches/{watch.pk}/" in page
        assert "verdict-pass" in page
        page = client.get(f"/ramps/watches/{watch.pk}/").content.decode()
        assert "Judged windows" in page and "Change the policy" in page
        refused = client.post(f"/ramps/watches/{watch.pk}/action/",
                              {"action": "policy", "policy": "alert", "reason": ""})
        assert refused.status_code == 400
        assert Watch.objects.get(pk=watch.pk).policy == "drain"
        done = client.post(f"/ramps/watches/{watch.pk}/action/",
                           {"action": "policy", "policy": "alert", "reason": "quiet"})
        assert done.status_code == 302
        assert Watch.objects.get(pk=watch.pk).policy == "alert"
