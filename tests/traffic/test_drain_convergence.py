"""Drains converge after faults, from the rows alone: a gateway back from a restart with a
backlog, a web process that died right after a drain's commit, drains stuck on a dead
gateway, push retries lost with a worker. All real: Envoy, the Celery worker, PostgreSQL; beat
is played by the `beat` fixture, which sends the traffic entries of the real beat schedule at
their own intervals (a whole beat process would also probe the test's pools)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.traffic import selectors
from fleetctl.traffic.gateways.base import adapter_for
from fleetctl.traffic.models import Drain, Gateway, GatewayPush, GatewayPushAttempt, Route
from fleetctl.traffic.push import drain_push_now
from fleetctl.traffic.services import (
    drain_request,
    drain_restore,
    gateway_create,
    revision_create,
    route_create,
)
from tests.conftest import SYSTEM
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
MODEL = "llama-3.1-8b-instruct"
OTHER_MODEL = "qwen2.5-7b-instruct"
OPEN = ("pending", "retrying")
# More drain records than the test worker has threads (12): watchers that held a thread
# while they waited would leave none for the pushes.
RECORDS = 13
BACKLOG = 20


class Beat:
    """The traffic entries of `app.conf.beat_schedule`, sent as `celery beat` sends them."""

    def __init__(self) -> None:
        from fleetctl.celery import app

        self._app = app
        self._entries = [e for e in app.conf.beat_schedule.values()
                         if str(e["task"]).startswith("traffic.")]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        due = [0.0] * len(self._entries)
        while not self._stop.is_set():
            now = time.monotonic()
            for i, entry in enumerate(self._entries):
                if now >= due[i]:
                    self._app.send_task(entry["task"], **entry.get("options", {}))
                    due[i] = now + float(entry["schedule"])  # type: ignore[arg-type]
            self._stop.wait(0.05)


@pytest.fixture
def beat(celery_worker: object) -> Iterator[Beat]:
    """Started by the test once its scene is set (a tick before that would repair it)."""
    ticking = Beat()
    yield ticking
    ticking.stop()


@dataclass
class Fleet:
    primary: Pool
    candidate: Pool
    route: Route  # drained and restored
    other: Route  # an unrelated route, ramped
    envoy: EnvoyProcess
    gateways: list[Gateway] = field(default_factory=list)

    def carry(self, name: str, admin_url: str, config_dir: Path, *routes: Route) -> Gateway:
        gateway = gateway_create(actor=SYSTEM, name=name, kind="envoy", admin_address=admin_url,
                                 options={"config_dir": str(config_dir), "load_timeout_s": 30},
                                 routes=list(routes))
        self.gateways.append(gateway)
        return gateway


@pytest.fixture
def fleet(celery_worker: object, envoy: EnvoyProcess, make_pool, system) -> Fleet:
    # Nothing listens on the pools' ports: these tests look at what the gateway holds.
    pools = [make_pool(name="primary"), make_pool(name="candidate")]
    for pool in pools:
        for model in (MODEL, OTHER_MODEL):
            pool_model_create(actor=system, pool=pool, model_id=model, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    route = route_create(actor=system, name="llama", model_id=MODEL, primary_pool=pools[0],
                         weights={"primary": 50, "candidate": 50}, reason="test")
    other = route_create(actor=system, name="qwen", model_id=OTHER_MODEL,
                         primary_pool=pools[0], weights={"primary": 90, "candidate": 10},
                         reason="test")
    return Fleet(primary=pools[0], candidate=pools[1], route=route, other=other, envoy=envoy)


def settled() -> bool:
    return not GatewayPush.objects.filter(status__in=OPEN).exists()


def holds_current_state(gateway: Gateway) -> bool:
    """The gateway itself, read back, against every route it carries at its current revision."""
    gateway = Gateway.objects.prefetch_related("routes").get(pk=gateway.pk)
    adapter = adapter_for(selectors.gateway_spec(gateway))
    try:
        return adapter.matches(selectors.gateway_desired_state(gateway=gateway),
                               adapter.read_back())
    except Exception:
        return False


def drain_and_restore(fleet: Fleet, count: int) -> list[Drain]:
    """`count` records on the fleet's route: a drain of the candidate, its restore, ..."""
    records: list[Drain] = []
    while len(records) < count:
        if records and records[-1].action == Drain.Action.DRAIN:
            records.append(drain_restore(actor=SYSTEM, drain=records[-1], reason="back"))
        else:
            records.append(drain_request(actor=SYSTEM, pool=fleet.candidate, reason="drill"))
        drain_push_now(records[-1])  # what the API does after the commit
    return records


def ramp(route: Route, weights: dict[str, int]) -> None:
    route.refresh_from_db()
    revision_create(actor=SYSTEM, route=route, weights=weights,
                    base_revision=route.revision_number, reason="unrelated ramp")


def incomplete(records: list[Drain]) -> list[tuple[int, str]]:
    return [(d.pk, d.status) for d in Drain.objects.filter(pk__in=[r.pk for r in records])
            if d.status != Drain.Status.COMPLETE]


def test_a_gateway_back_from_a_crash_gets_its_backlog_and_every_drain_completes(
    fleet: Fleet, beat: Beat
):
    gateway = fleet.carry("edge", fleet.envoy.admin_url, fleet.envoy.workdir, fleet.route,
                          fleet.other)
    wait_until(settled, timeout_s=60, what="the first pushes")
    beat.start()
    fleet.envoy.kill()
    records = drain_and_restore(fleet, BACKLOG - 1)  # ends drained: the candidate must be off
    ramp(fleet.other, {"primary": 70, "candidate": 30})
    wait_until(lambda: Drain.objects.get(pk=records[-1].pk).status == "partial",
               what="the last drain to show partial (its gateway is down)")
    time.sleep(5)  # down a while (the Envoy was down for minutes)

    fleet.envoy.start(timeout_s=60)  # it comes back with whatever its files hold
    wait_until(lambda: not incomplete(records), timeout_s=90, every_s=0.5,
               what="every drain and restore to complete")
    wait_until(lambda: holds_current_state(gateway), timeout_s=30,
               what="the gateway to hold every route at its current revision")
    assert settled()
    assert Gateway.objects.get(pk=gateway.pk).state == "in-sync"


def test_a_drain_whose_web_process_died_after_the_commit_completes_from_the_rows(
    fleet: Fleet, beat: Beat
):
    gateway = fleet.carry("edge", fleet.envoy.admin_url, fleet.envoy.workdir, fleet.route)
    wait_until(settled, timeout_s=60, what="the first pushes")
    drain = drain_request(actor=SYSTEM, pool=fleet.candidate, reason="web process dies")
    # The process dies right after the commit: nothing it meant to do then happens (the first
    # push, push.drain_push_now, queueing the watcher).
    assert list(GatewayPush.objects.filter(revision__in=drain.revisions.all())
                .values_list("status", "attempts")) == [("pending", 0)]
    beat.start()
    wait_until(lambda: Drain.objects.get(pk=drain.pk).status == "complete", timeout_s=90,
               every_s=0.5, what="the drain to complete from the rows")
    assert holds_current_state(gateway)


def test_drains_stuck_on_a_dead_gateway_do_not_hold_up_an_unrelated_ramp(
    fleet: Fleet, beat: Beat, tmp_path: Path
):
    (tmp_path / "dead").mkdir()  # its files are there; the process is gone
    dead = fleet.carry("dead", f"http://127.0.0.1:{free_port()}", tmp_path / "dead",
                       fleet.route)
    live = fleet.carry("edge", fleet.envoy.admin_url, fleet.envoy.workdir, fleet.other)
    wait_until(lambda: holds_current_state(live), timeout_s=60, what="the first push")
    beat.start()
    records = drain_and_restore(fleet, RECORDS)
    wait_until(lambda: all(status == "partial" for _, status in incomplete(records)),
               what="every drain to wait on the dead gateway")
    ramp(fleet.other, {"primary": 60, "candidate": 40})
    wait_until(lambda: holds_current_state(live), timeout_s=60,
               what="the ramp to reach the live gateway")
    assert len(incomplete(records)) == RECORDS  # they still wait, and say why
    assert Gateway.objects.get(pk=dead.pk).state == "failing"
    assert all("dead" in d.last_error for d in Drain.objects.filter(pk__in=[r.pk for r in records]))


def test_leftover_retrying_pushes_whose_retries_were_lost_are_driven_again(
    fleet: Fleet, beat: Beat
):
    gateway = fleet.carry("edge", fleet.envoy.admin_url, fleet.envoy.workdir, fleet.route)
    wait_until(settled, timeout_s=60, what="the first pushes")
    ramp(fleet.route, {"primary": 80, "candidate": 20})
    wait_until(settled, timeout_s=60, what="the ramp")
    # The gateway restarted empty while two pushes to it were retrying, and the worker that
    # held their retries (Celery countdown messages) died: the rows say `retrying`, nobody
    # will retry them.
    fleet.envoy.stop()
    fleet.envoy.forget_configuration()
    fleet.envoy.start(timeout_s=60)
    long_ago = timezone.now() - timedelta(minutes=5)
    leftovers = [
        GatewayPush.objects.create(revision=revision, gateway=gateway, status="retrying",
                                   attempts=4, last_error="connection refused",
                                   created_at=long_ago)
        for revision in fleet.route.revisions.order_by("number")
    ]
    for push in leftovers:
        GatewayPushAttempt.objects.create(push=push, number=4, sent_at=long_ago,
                                          answered_at=long_ago, error="connection refused")
    assert not holds_current_state(gateway)
    beat.start()
    wait_until(settled, timeout_s=90, every_s=0.5, what="the leftover pushes to be settled")
    assert holds_current_state(gateway)
    statuses = dict(GatewayPush.objects.filter(pk__in=[p.pk for p in leftovers])
                    .values_list("revision__number", "status"))
    current = Route.objects.get(pk=fleet.route.pk).revision_number
    assert statuses == {**{n: "superseded" for n in statuses if n < current},
                        current: "verified"}
