"""How long after a pool's servers report an upgrade nobody registered its re-verification
starts and finishes, with nobody clicking.

A simulated candidate (and its twin as the primary) in an open plan. Each round the
candidate's simulator starts reporting another server version (`/admin/faults`
`server_version`, what `fleetctl sim fault --server-version` sends), and we only watch the
rows the system writes: the probe's record of the new version (`Pool.reported`), the
conformance probe `system:reverify` starts, and that probe's end. Reported per round, then
the median and max of: change → recorded by the probe, change → re-verification started
(target ≤ one probe interval), change → re-verification finished.

Everything on the real path: PostgreSQL (`DATABASE_URL`, default a local
`fleetctl_bench_reverify`, recreated empty), Redis (`REDIS_URL`, default db 10), the
simulator, Celery beat (which sends `fleet.pools_probe_due` every HEALTH_PROBE_INTERVAL_S, as
in production) and a Celery worker on the `probe` and `default` queues.

    .venv/bin/python benchmarks/reverify_latency.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
MODEL = "llama-3.1-8b-instruct"


def wait_for(what: str, read: Any, timeout_s: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = read()
        if value:
            return value
        time.sleep(0.1)
    raise TimeoutError(f"waited {timeout_s:g} s for {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from benchmarks.ramp_fault_to_drained import _stop, setup_env

    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/10")
    setup_env("fleetctl_bench_reverify")
    from django.conf import settings
    from django.contrib.auth.models import Group, User

    from benchmarks.drain_convergence import purge_queues, start_beat
    from fleetctl.accounts.actor import Actor
    from fleetctl.conformance.models import ConformanceRun
    from fleetctl.fleet.models import Pool
    from fleetctl.fleet.services import region_create
    from fleetctl.traffic.services import route_create
    from migrations_plan.services import plan_create
    from tests.ramps import e2e
    from tests.sim.simproc import sim_with_profiles
    from tests.support.profiles import TEST_PROFILES

    work = Path(tempfile.mkdtemp(prefix="reverify-bench-"))
    purge_queues()
    sim = sim_with_profiles(work / "sim", TEST_PROFILES, {"good": "quick", "twin": "quick-twin"})
    system = Actor.for_system("bench")
    region = region_create(actor=system, code="us-east", name="US East", jurisdiction="US")
    pools = e2e.make_pools(system, sim, ["good", "twin"], region)
    route = route_create(actor=system, name="llama", model_id=MODEL, primary_pool=pools["twin"],
                         reason="benchmark")
    lead = User.objects.create_user(username="bench-lead")
    lead.groups.set([Group.objects.get_or_create(name="platform-lead")[0]])
    plan = plan_create(actor=Actor(user=lead), name="reverify-bench",
                       candidate_pool=pools["good"], primary_pool=pools["twin"], routes=[route],
                       slo_ttft_p95_ms=800, slo_tpot_p95_ms=60, slo_error_rate=0.01)
    worker = e2e.start_worker(dict(os.environ), work / "worker.log", name=f"rv-{os.getpid()}",
                              queues="probe,default")
    beat = start_beat(work)
    candidate = pools["good"]
    recorded: list[float] = []
    started: list[float] = []
    finished: list[float] = []
    interval = float(settings.HEALTH_PROBE_INTERVAL_S)
    print(f"HEALTH_PROBE_INTERVAL_S={interval:g}; plan {plan.name}, candidate {candidate.name} "
          f"against {pools['twin'].name}", flush=True)
    try:
        wait_for("the first probe's report", lambda: Pool.objects.get(
            pk=candidate.pk).reported.get("server_version"))
        for round_no in range(1, args.rounds + 1):
            version = f"0.{90 + round_no}.0"
            changed_at = datetime.now(UTC)
            e2e.set_fault(sim.url("good"), server_version=version)
            t_recorded = wait_for("the probe to record the new version", lambda v=version: (
                (p := Pool.objects.get(pk=candidate.pk)).reported.get("server_version") == v
                and p.reported_at))
            run = wait_for("the re-verification probe", lambda at=changed_at: (
                ConformanceRun.objects.filter(pool=candidate, created_by="system:reverify",
                                              created_at__gte=at).order_by("pk").first()))
            done = wait_for("the re-verification to finish", lambda r=run: (
                (row := ConformanceRun.objects.get(pk=r.pk)).status
                not in ConformanceRun.ACTIVE and row))
            end = done.finished_at or datetime.now(UTC)
            recorded.append((t_recorded - changed_at).total_seconds())
            started.append((run.created_at - changed_at).total_seconds())
            finished.append((end - changed_at).total_seconds())
            print(f"round {round_no}: version {version}: recorded {recorded[-1]:.1f} s, "
                  f"re-verification started {started[-1]:.1f} s, finished {finished[-1]:.1f} s "
                  f"({done.status}, verdict {done.verdict})", flush=True)
    finally:
        for proc in (beat, worker):
            _stop(proc)
        sim.stop()
    if started:
        for label, values in (("change → recorded by the probe", recorded),
                              ("change → re-verification started", started),
                              ("change → re-verification finished", finished)):
            print(f"{label}: median {statistics.median(values):.1f} s, max {max(values):.1f} s"
                  + (f" (target ≤ one probe interval, {interval:g} s)"
                     if "started" in label else ""))
    print(f"logs: {work}")


if __name__ == "__main__":
    main()
