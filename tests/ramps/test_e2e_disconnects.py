"""Clients who hang up are not the pool's failures, end to end: the world of
test_e2e_guarded.py (simulated pools behind a real Envoy writing its access log, the ingester
process, streamed traffic, the worker ticking the ramps) plus an anonymous client on the
gateway's port that abandons a request ten times a second — the attack of issue 25, which
rolled back a healthy pool at 50 % — while a guarded ramp holds.

Envoy logs each of those as status 0 with the flag DC. The guard must judge the pool on the
requests it was left to answer: the ramp completes, its decisions and the telemetry API show
the client disconnects, and a pool that really fails still goes back under the same attack."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from django.utils import timezone

from tests.ramps import e2e
from tests.ramps.test_e2e_guarded import (  # noqa: F401 - the module's world, as fixtures
    HOLD_S,
    envoy,
    finished,
    sims,
    start_ramp,
    ticker,
    worker_env,
    world,
)
from tests.traffic.accesslog import abandon

pytestmark = [pytest.mark.slow]
HANG_UPS_PER_S = 10.0
STEPS = [{"percent": 50, "hold_s": HOLD_S}, {"percent": 60, "hold_s": HOLD_S}]


class HangUps:
    """Requests abandoned through the gateway at `rps`, from a thread: each one sent whole
    without credentials on a socket of its own, closed at once (no answer read)."""

    def __init__(self, url: str, rps: float) -> None:
        self.url, self.rps, self.sent = url, rps, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> HangUps:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            abandon(self.url, stream=False, max_tokens=512, prompt=f"hang up {self.sent}")
            self.sent += 1
            self._stop.wait(1 / self.rps)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(timeout=10)
        return self.sent


def candidate_disconnects(pool: str, *, since) -> int:
    from fleetctl.telemetry.selectors import pool_stats

    return pool_stats(pool=pool, route="llama", since=since).client_disconnects


def test_clients_who_hang_up_on_a_healthy_ramp_are_counted_apart_and_never_roll_it_back(
        world, client_for):  # noqa: F811
    began = timezone.now() - timedelta(seconds=1)
    attack = HangUps(world["envoy"].listen_url, HANG_UPS_PER_S).start()
    try:
        # The hang-ups reach the log, and the ingester counts them, before the ramp starts.
        e2e.wait_for(lambda: candidate_disconnects("primary", since=began) >= 10,
                     timeout_s=60, what="the primary's first client disconnects in telemetry")
        ramp = start_ramp(world, "cand", STEPS)
        e2e.wait_for(lambda: finished(ramp), timeout_s=150, what="the ramp to finish",
                     explain=lambda: e2e.explain(ramp))
    finally:
        sent = attack.stop()

    assert ramp.state == "complete", e2e.explain(ramp)
    kinds = e2e.ramp_events(ramp)
    assert not {"fail", "rollback"} & set(kinds), e2e.explain(ramp)
    assert sent >= 40
    # Each hold's decision kept the disconnects it set apart, for both pools.
    passes = list(ramp.events.filter(kind="pass").order_by("at", "id"))
    assert len(passes) == 2, e2e.explain(ramp)
    for event in passes:
        for role in ("candidate", "primary"):
            stats = event.numbers[role]
            assert stats["client_disconnects"] > 0, (role, stats)
            assert stats["error_rate"]["value"] == 0.0, (role, stats)
    assert world["traffic"].outcomes["ok"] > 0

    # The ramp page shows them with each decision's numbers; the API gives the count.
    viewer = client_for("viewer")
    page = viewer.get(f"/ramps/{ramp.pk}/")
    assert page.status_code == 200
    assert "client disconnects" in page.content.decode()
    answer = viewer.get("/api/v1/telemetry/pools/cand/", {"route": "llama",
                                                          "since": began.isoformat()})
    assert answer.status_code == 200, answer.content
    stats = answer.json()["stats"]
    assert stats["client_disconnects"] >= 5 and stats["errors"] == 0, stats
    assert stats["error_rate"]["n"] == stats["requests"]
    assert any(point["client_disconnects"] for point in answer.json()["series"])


def test_a_pool_that_really_fails_is_rolled_back_while_clients_hang_up(world):  # noqa: F811
    attack = HangUps(world["envoy"].listen_url, HANG_UPS_PER_S).start()
    try:
        ramp = start_ramp(world, "cand", [{"percent": 50, "hold_s": 600}])
        e2e.wait_for(lambda: (ramp.refresh_from_db() or ramp.step_started_at is not None),
                     timeout_s=60, what="the ramp's step", explain=lambda: e2e.explain(ramp))
        e2e.set_fault(world["sims"].url("cand"), error_rate=0.5)
        e2e.wait_for(lambda: finished(ramp), timeout_s=90, what="the guard to roll back",
                     explain=lambda: e2e.explain(ramp))
    finally:
        attack.stop()

    assert ramp.state == "rolled-back", e2e.explain(ramp)
    fail = ramp.events.filter(kind="fail").last()
    assert fail is not None and "error rate" in fail.message, e2e.explain(ramp)
    assert fail.numbers["candidate"]["errors"] > 0
