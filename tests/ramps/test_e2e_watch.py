"""The standing live watch end to end, every part real (the world of test_e2e_guarded.py:
simulated pools behind a real Envoy writing its access log, the telemetry ingester, streamed
traffic from the `openai` client, the module's Celery worker on the `watch` queue), plus a
loop sending `ramps.watch_tick` as beat does. The pools here carry the simulator's replica
noise (profile `replica`). A ramp completes and hands over; a latency fault on its pool then
makes the watch drain it off Envoy (policy drain); an A/A twin is watched window after window
and never drained."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetctl.ramps.models import Watch, WatchVerdict
from fleetctl.traffic.models import Drain
from tests.ramps import e2e
from tests.ramps import test_e2e_guarded as guarded
from tests.sim.simproc import sim_with_profiles
from tests.support.profiles import TEST_PROFILES

pytestmark = [pytest.mark.slow]
# The world of test_e2e_guarded.py, by name (its `sims` is replaced by the noisy one below).
envoy, ticker, worker_env, world = guarded.envoy, guarded.ticker, guarded.worker_env, \
    guarded.world
HOLD_S, finished, start_ramp = guarded.HOLD_S, guarded.finished, guarded.start_ramp


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """The world's pools, with replica noise: twins as alike as two real replicas are."""
    sim = sim_with_profiles(tmp_path_factory.mktemp("watch-sims"), TEST_PROFILES,
                            {"primary": "replica", "cand": "replica", "twin": "replica"})
    yield sim
    sim.stop()


@pytest.fixture
def watching(world) -> Iterator[dict]:
    ticks = e2e.TickLoop(task="ramps.watch_tick").start()
    try:
        yield world
    finally:
        ticks.stop()


def completed(w: dict, pool: str) -> Watch:
    ramp = start_ramp(w, pool, [{"percent": 50, "hold_s": HOLD_S}])
    e2e.wait_for(lambda: finished(ramp), timeout_s=120, what="the ramp to finish",
                 explain=lambda: e2e.explain(ramp))
    assert ramp.state == "complete", e2e.explain(ramp)
    return Watch.objects.get(ramp=ramp, pool__name=pool)


def history(watch: Watch) -> str:
    return "\n".join(f"{v.window_start:%H:%M:%S} {v.verdict} {v.action} {v.summary[:200]}"
                     for v in watch.verdicts.order_by("window_start"))


def test_a_fault_after_the_ramp_completed_is_drained_by_the_standing_watch(watching):
    watch = completed(watching, "cand")
    assert (watch.policy, watch.state) == ("drain", "active")
    e2e.wait_for(lambda: watch.verdicts.filter(verdict="pass").count() >= 2, timeout_s=60,
                 what="the watch to pass two windows", explain=lambda: history(watch))

    e2e.set_fault(watching["sims"].url("cand"), added_latency_ms=guarded.FAULT_MS)

    def ended() -> bool:
        watch.refresh_from_db()
        return watch.state == "ended"

    e2e.wait_for(ended, timeout_s=90, what="the watch to drain the pool",
                 explain=lambda: history(watch))
    assert watch.drain_id is not None, watch.ended_reason
    assert watch.verdicts.filter(action="drained").count() == 1, history(watch)
    drain = Drain.objects.get(pk=watch.drain_id)
    assert drain.requested_by == "system:live-watch"
    e2e.wait_for(lambda: Drain.objects.get(pk=drain.pk).verified_at is not None,
                 timeout_s=60, what="the drain to be verified on the gateway")
    held = e2e.envoy_weights(watching["envoy"], "llama")
    assert held.get("cand", 0) == 0 and held["primary"] == 100, held


def test_an_aa_twin_with_replica_noise_is_watched_and_never_drained(watching):
    watch = completed(watching, "twin")
    # Six judged windows on real traffic (the long A/A runs are tests/ramps/test_watch.py's two
    # hours and benchmarks/watch_aa_false_drains.py's 20, on a moved clock).
    e2e.wait_for(lambda: watch.verdicts.exclude(verdict="insufficient").count() >= 6,
                 timeout_s=120, what="six judged windows", explain=lambda: history(watch))
    watch.refresh_from_db()
    assert watch.state == "active" and watch.drain_id is None, history(watch)
    assert not WatchVerdict.objects.filter(watch=watch, action="drained").exists()
    assert e2e.envoy_weights(watching["envoy"], "llama") == {"primary": 50, "twin": 50}
