"""How long after a gateway comes back every open drain is complete.

One Envoy carries a route split between two simulated pools. Each round: the Envoy is killed
(SIGKILL, a crash), ten changes are made while it is down — drains of the candidate, their
restores, ramps, ending drained — it stays down a while (`--down-s` plus 0–5 s, long enough
for the push backoff to reach its cap), then it is started again. Measured from the moment
its admin port answers (`/ready` is LIVE) until every drain and restore of the round is
`complete` and the Envoy, read back, holds every route at its current revision. Reported per
round, then the median and max (target ≤ 10 s).

Everything real: PostgreSQL (`DATABASE_URL`, default a local `fleetctl_bench_converge`), Redis
(db 8), the simulator, Envoy, a Celery worker on the `push` and `watch` queues and Celery beat
(which runs the converge task every `TRAFFIC_CONVERGE_INTERVAL_S`, as in production). Nobody
polls on the drains' behalf but the system itself; this script only reads rows and the Envoy.

    .venv/bin/python benchmarks/drain_convergence.py [--rounds 5] [--changes 10] [--down-s 15]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fleetctl.accounts.actor import Actor
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic.models import Drain, Route

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = "llama-3.1-8b-instruct"


def setup_env() -> None:
    os.environ.setdefault("DATABASE_URL",
                          "postgres://postgres@127.0.0.1:5432/fleetctl_bench_converge")
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/8")
    from fleetctl.demo.devstack import local_destinations
    local_destinations(os.environ)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "benchmark-only")
    from benchmarks.overview_and_pools_api import ensure_database

    ensure_database(os.environ["DATABASE_URL"])


def start_beat(workdir: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "fleetctl", "beat", "-l", "INFO",
         "-s", str(workdir / "beat-schedule")],
        cwd=ROOT, stdout=open(workdir / "beat.log", "wb"),
        stderr=subprocess.STDOUT)


def purge_queues() -> None:
    from fleetctl.celery import QUEUES, app

    with app.connection_for_write() as conn:
        for queue in QUEUES:
            conn.default_channel.queue_purge(queue)  # type: ignore[attr-defined]


class Changes:
    """Drains, restores and ramps on one route, in an order the services accept: a drain is
    restored before the next change, ramps move the candidate's share."""

    def __init__(self, route: Route, candidate: Pool) -> None:
        self.route, self.candidate = route, candidate
        self.open_drain: Drain | None = None
        self.share = 50

    def make(self, count: int) -> list[int]:
        """`count` changes ending with a drain in force; returns the drain and restore ids."""
        from fleetctl.accounts.actor import Actor as SystemActor
        from fleetctl.traffic import services as traffic

        system = SystemActor.for_system("benchmark")
        records: list[int] = []
        for i in range(count):
            last = i == count - 1
            if self.open_drain is not None:
                record = traffic.drain_restore(actor=system, drain=self.open_drain,
                                               reason="benchmark")
                self.open_drain = None
                records.append(record.pk)
            elif last or i % 3 == 0:
                self.open_drain = traffic.drain_request(actor=system, pool=self.candidate,
                                                        reason="benchmark")
                records.append(self.open_drain.pk)
            else:
                self.ramp(system)
        return records

    def ramp(self, system: Actor) -> None:
        from fleetctl.traffic import services as traffic
        from fleetctl.traffic.models import Route as Routes

        self.share = 10 + (self.share + 7) % 40
        route = Routes.objects.get(pk=self.route.pk)
        traffic.revision_create(actor=system, route=route,
                                weights={"primary": 100 - self.share, "candidate": self.share},
                                base_revision=route.revision_number, reason="benchmark")


def converged(records: list[int], gateway_id: int) -> bool:
    from fleetctl.traffic import selectors
    from fleetctl.traffic.gateways.base import AdapterError, adapter_for
    from fleetctl.traffic.models import Drain, Gateway

    if Drain.objects.filter(pk__in=records).exclude(status="complete").exists():
        return False
    gateway = Gateway.objects.prefetch_related("routes").get(pk=gateway_id)
    adapter = adapter_for(selectors.gateway_spec(gateway))
    try:
        return adapter.matches(selectors.gateway_desired_state(gateway=gateway),
                               adapter.read_back())
    except AdapterError:
        return False


def first_verified_after(started_wall: float) -> float | None:
    """Seconds from `started_wall` to the first verified push attempt after it."""
    from fleetctl.traffic.models import GatewayPushAttempt

    attempt = (GatewayPushAttempt.objects.filter(verified=True,
                                                 sent_at__gte=datetime.fromtimestamp(
                                                     started_wall, UTC))
               .order_by("sent_at").first())
    if attempt is None or attempt.answered_at is None:
        return None
    return attempt.answered_at.timestamp() - started_wall


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--changes", type=int, default=10)
    parser.add_argument("--down-s", type=float, default=15.0)
    args = parser.parse_args()
    setup_env()
    import django

    django.setup()
    from django.conf import settings
    from django.core.management import call_command

    from benchmarks.drain_latency import start_sim, start_worker, wait
    from fleetctl.accounts.actor import Actor
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess
    from fleetctl.fleet import services as fleet
    from fleetctl.traffic import services as traffic
    from fleetctl.traffic.models import GatewayPush

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    purge_queues()
    work = Path(tempfile.mkdtemp(prefix="fleetctl-converge-bench-"))
    ports = {"primary": free_port(), "candidate": free_port()}
    sim = start_sim(work, ports)
    envoy = EnvoyProcess(work / "envoy", free_port(), free_port())
    worker = beat = None
    system = Actor.for_system("benchmark")
    rows: list[tuple[float, float | None, int]] = []
    try:
        envoy.start()
        worker = start_worker(work)
        beat = start_beat(work)
        region = fleet.region_create(actor=system, code="us-east", name="US", jurisdiction="US")
        pools = {}
        for name, port in ports.items():
            pools[name] = fleet.pool_create(
                actor=system, name=name, runtime="cuda", accelerator="sim", region=region,
                base_urls=[f"http://127.0.0.1:{port}"], max_context_tokens=32768,
                node_hourly_rate="1")
            fleet.pool_model_create(actor=system, pool=pools[name], model_id=MODEL,
                                    max_context_tokens=32768)
            fleet.pool_health_record(pool_id=pools[name].pk, ok=True, status_code=200,
                                     latency_ms=1)
        route = traffic.route_create(actor=system, name="bench", model_id=MODEL,
                                     primary_pool=pools["primary"],
                                     weights={"primary": 50, "candidate": 50})
        gateway = traffic.gateway_create(actor=system, name="edge", kind="envoy",
                                         admin_address=envoy.admin_url,
                                         options={"config_dir": str(envoy.workdir)},
                                         routes=[route])
        wait(lambda: not GatewayPush.objects.exclude(status__in=["verified", "superseded"])
             .exists(), "initial pushes")
        changes = Changes(route, pools["candidate"])
        for number in range(1, args.rounds + 1):
            envoy.kill()
            records = changes.make(args.changes)
            # Down a while, never exactly as long: its return falls anywhere in the retry cycle.
            time.sleep(args.down_s + random.uniform(0, 5))
            envoy.start(timeout_s=60)
            back_wall, back = time.time(), time.monotonic()
            wait(lambda r=records: converged(r, gateway.pk), "convergence", timeout_s=300)
            took = time.monotonic() - back
            rows.append((took, first_verified_after(back_wall), len(records)))
            print(f"round {number}: converged {took:.2f} s after the Envoy answered "
                  f"({len(records)} drains and restores, {args.changes} changes)", flush=True)
    finally:
        for proc in (beat, worker):
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=30)
        envoy.stop()
        sim.terminate()
        purge_queues()
    times = [took for took, _, _ in rows]
    pushes = [push for _, push, _ in rows if push is not None]
    every = settings.TRAFFIC_CONVERGE_INTERVAL_S
    print(f"1 Envoy, {args.rounds} rounds of {args.changes} changes made while it was down "
          f"for {args.down_s:g}-{args.down_s + 5:g} s; converge task every {every:g} s; "
          f"2 cores shared by everything ({datetime.now(UTC):%Y-%m-%d})")
    print(f"Envoy answering → every drain complete and the current revision held: median "
          f"{statistics.median(times):.2f} s, max {max(times):.2f} s (target ≤ 10 s)")
    if pushes:
        print(f"  of which: Envoy answering → first push verified (the retry of the newest "
              f"open push): median {statistics.median(pushes):.2f} s, max {max(pushes):.2f} s")


if __name__ == "__main__":
    main()
