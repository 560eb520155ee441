"""A ramp whose guard lists a Prometheus query, driven by the controller (ticks at chosen
times, telemetry as Window rows, as tests/ramps/test_services.py does) with the query answered
by the real Prometheus: a passing metric lets the ramp step up, a failing one rolls it back
like the guard's own figures, a Prometheus that is down makes it wait (no step, no count)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleetctl.core.ports import free_port
from fleetctl.prometheus import services
from fleetctl.ramps.services import ramps_tick
from tests.ramps.test_services import GOOD, fleet, fresh, oncall, start, weights  # noqa: F401
from tests.ramps.windows import boundary, traffic

pytestmark = pytest.mark.django_db

UP = 'up{pool="mi300x-us"}'  # the stack's candidate pool, scraped


@pytest.fixture
def sources(stack, make_user):
    from fleetctl.accounts.actor import Actor

    admin = Actor(user=make_user("root", "admin"))
    services.source_create(actor=admin, name="prom", base_url=stack.prometheus.url)
    services.source_create(actor=admin, name="gone", base_url=f"http://127.0.0.1:{free_port()}",
                           timeout_s=1.0)


def test_a_passing_metric_lets_the_ramp_step_up(fleet, oncall, sources):  # noqa: F811
    ramp = start(fleet, oncall, metric_checks=[
        {"source": "prom", "query": UP, "success": "result == 1", "name": "scraped"}])
    t0 = boundary(timezone.now())
    ramps_tick(now=t0)
    traffic(since=t0, until=t0 + timedelta(seconds=31), per_window={"cand": GOOD, "prim": GOOD})
    ramps_tick(now=t0 + timedelta(seconds=31))
    assert weights(fleet.route) == {"prim": 5000, "cand": 5000}
    passed = fresh(ramp).events.get(kind="pass")
    assert "scraped = 1: 'result == 1' holds (queried from prom)" in passed.message
    assert passed.numbers["metrics"][0]["values"][0]["value"] == 1.0


def test_a_failing_metric_rolls_the_ramp_back(fleet, oncall, sources):  # noqa: F811
    ramp = start(fleet, oncall, metric_checks=[
        {"source": "prom", "query": UP, "failure": "result >= 1", "name": "a bad sign"}])
    t0 = boundary(timezone.now())
    ramps_tick(now=t0)
    traffic(since=t0, until=t0 + timedelta(seconds=31), per_window={"cand": GOOD, "prim": GOOD})
    ramps_tick(now=t0 + timedelta(seconds=11))
    assert fresh(ramp).consecutive_failures == 1
    ramps_tick(now=t0 + timedelta(seconds=21))
    ramp = fresh(ramp)
    assert ramp.state == "rolled-back" and ramp.drain is not None
    assert "a bad sign = 1: failure condition 'result >= 1' holds" in ramp.state_reason


def test_a_prometheus_that_is_down_pauses_the_advance(fleet, oncall, sources):  # noqa: F811
    ramp = start(fleet, oncall, metric_checks=[
        {"source": "gone", "query": UP, "success": "result == 1"}])
    t0 = boundary(timezone.now())
    ramps_tick(now=t0)
    traffic(since=t0, until=t0 + timedelta(seconds=41), per_window={"cand": GOOD, "prim": GOOD})
    for seconds in (11, 21, 31, 41):
        ramps_tick(now=t0 + timedelta(seconds=seconds))
    ramp = fresh(ramp)
    assert (ramp.state, ramp.step_index, ramp.consecutive_failures) == ("running", 0, 0)
    assert weights(fleet.route) == {"prim": 9500, "cand": 500}
    waited = ramp.events.filter(kind="wait").last()
    assert "unreachable" in waited.message and "never advances on no data" in waited.message
