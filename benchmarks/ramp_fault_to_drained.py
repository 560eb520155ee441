"""How long a guarded ramp takes to take a faulty candidate off every gateway by itself.

Two Envoy gateways on loopback carry streamed chat traffic (the `openai` client, 20 requests/s
in all, round robin) to two simulated pools; a guarded ramp holds the candidate at 10 % (one
long step). Each round: the ramp has judged a clean window; then the candidate's time to first
token gets +300 ms (the simulator's /admin/faults) and we wait until the ramp has rolled back
and its drain is verified on every gateway. Reported: fault → rollback decision (the ROLLBACK
event) and fault → drained on every gateway (`Drain.verified_at`), median and max over the
rounds (target ≤ 30 s with 10 s telemetry windows). With `--paused`, a person pauses the
ramp after its clean window and the fault comes while it is paused: the guard still judges a
paused ramp (issue 27), so the same figures measure "fault while paused → drained".

Everything on the real path: Envoy writes its JSON access log, the telemetry ingester process
(`python -m fleetctl.telemetry.ingest`) follows it into 10 s windows, a Celery worker (watch,
push, default; threads) runs `ramps.tick` — sent every RAMP_TICK_INTERVAL_S by a loop here, as
beat does — and pushes the drain to both Envoys. PostgreSQL (`DATABASE_URL`, default a local
`fleetctl_bench_ramp`, recreated empty), Redis (`REDIS_URL`, default db 9).

    .venv/bin/python benchmarks/ramp_fault_to_drained.py [--rounds 5] [--rps 20] [--paused]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup_env(database: str) -> None:
    os.environ.setdefault("DATABASE_URL", f"postgres://postgres@127.0.0.1:5432/{database}")
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/9")
    from fleetctl.demo.devstack import local_destinations
    local_destinations(os.environ)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "benchmark-only")
    import psycopg

    url = os.environ["DATABASE_URL"]
    name = url.rsplit("/", 1)[1]
    with psycopg.connect(url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        # A fresh database each run: old windows, ramps and drains would only get in the way.
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    import logging

    for noisy in ("httpx", "httpx2"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class World:
    """Simulated pools, `gateways` Envoys with their access logs, routes, the ingester, a
    worker and the tick loop; `close()` stops them all."""

    def __init__(self, work: Path, *, pools: list[str], routes: dict[str, tuple[str, str]],
                 gateways: int = 2, models: list[str] | None = None) -> None:
        from fleetctl.accounts.actor import Actor
        from fleetctl.core.ports import free_port
        from fleetctl.demo.envoy_process import EnvoyProcess
        from fleetctl.fleet.services import pool_model_create, region_create
        from fleetctl.traffic.services import route_create
        from tests.ramps import e2e
        from tests.sim.simproc import SimProcess

        self.actor = Actor.for_system("bench")
        self.work = work
        self.models = models or [e2e.MODEL]
        self._closers: list[Any] = []
        (work / "profiles.toml").write_text(e2e.PROFILES)
        args = ["--profiles", str(work / "profiles.toml"), "--log-level", "WARNING"]
        for model in self.models:
            args += ["--model", model]
        for name in pools:
            args += ["--pool", f"{name}=quick@0"]
        self.sim = SimProcess(args, len(pools), work / "sim.log")
        self._closers.append(self.sim.stop)
        region = region_create(actor=self.actor, code="us-east", name="US East",
                               jurisdiction="US")
        self.pools = e2e.make_pools(self.actor, self.sim, pools, region)
        for pool in self.pools.values():
            for model in self.models[1:]:
                pool_model_create(actor=self.actor, pool=pool, model_id=model,
                                  max_context_tokens=4096)
        self.routes = {
            name: route_create(actor=self.actor, name=name, model_id=model,
                               primary_pool=self.pools[primary], reason="benchmark")
            for name, (model, primary) in routes.items()}
        self.envoys = []
        for i in range(gateways):
            envoy = EnvoyProcess(work / f"envoy-{i}", free_port(), free_port()).start(
                timeout_s=60)
            self._closers.append(envoy.stop)
            self.envoys.append(envoy)
        env = dict(os.environ)
        self.worker = e2e.start_worker(env, work / "worker.log", name=f"bench-{os.getpid()}",
                                       queues="watch,push,default")
        self._closers.append(lambda: _stop(self.worker))
        self.gateways = [e2e.make_gateway(self.actor, envoy, list(self.routes.values()),
                                          name=f"envoy-{i}")
                         for i, envoy in enumerate(self.envoys)]
        self.ingester = e2e.Ingester(env, work / "ingester.log").start()
        self._closers.append(self.ingester.stop)
        self.ticks = e2e.TickLoop().start()
        self._closers.append(self.ticks.stop)

    def traffic(self, rps: float, model: str | None = None) -> list[Any]:
        """Streamed traffic at `rps` in all, shared evenly over the gateways."""
        from tests.ramps import e2e

        loads = [e2e.Traffic(envoy.listen_url, rps / len(self.envoys), model=model or e2e.MODEL)
                 .start() for envoy in self.envoys]
        self._closers.append(lambda: [load.stop() for load in loads])
        return loads

    def close(self) -> None:
        for close in reversed(self._closers):
            try:
                close()
            except Exception as exc:  # stop everything we can
                print(f"(while stopping: {exc})", flush=True)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def settings_line() -> str:
    from django.conf import settings

    return (f"TELEMETRY_WINDOW_S={settings.TELEMETRY_WINDOW_S}, "
            f"TELEMETRY_FLUSH_INTERVAL_S={settings.TELEMETRY_FLUSH_INTERVAL_S}, "
            f"RAMP_TICK_INTERVAL_S={settings.RAMP_TICK_INTERVAL_S}, "
            f"RAMP_LEASE_S={settings.RAMP_LEASE_S}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rps", type=float, default=20.0)
    parser.add_argument("--percent", type=float, default=10.0)
    parser.add_argument("--added-latency-ms", type=float, default=300.0)
    parser.add_argument("--window-s", type=int, default=10)
    parser.add_argument("--min-samples", type=int, default=10)
    parser.add_argument("--failure-threshold", type=int, default=2)
    parser.add_argument("--gateways", type=int, default=2)
    parser.add_argument("--paused", action="store_true",
                        help="pause the ramp (as a person) before the fault")
    args = parser.parse_args()
    setup_env("fleetctl_bench_ramp")

    from django.conf import settings

    from fleetctl.ramps.models import Ramp
    from fleetctl.ramps.services import ramp_create, ramp_pause
    from fleetctl.traffic.models import Drain
    from tests.ramps import e2e

    work = Path(tempfile.mkdtemp(prefix="ramp-bench-"))
    began = time.monotonic()
    world = World(work, pools=["primary", "cand"], routes={"llama": (e2e.MODEL, "primary")},
                  gateways=args.gateways)
    decided: list[float] = []
    drained: list[float] = []
    early = 0
    try:
        world.traffic(args.rps)
        print(f"{args.gateways} Envoy gateways, {args.rps:g} streamed requests/s, candidate at "
              f"{args.percent:g} %, fault +{args.added_latency_ms:g} ms TTFT; window "
              f"{args.window_s} s, min_samples {args.min_samples}, failure_threshold "
              f"{args.failure_threshold}; {settings_line()}"
              f"{'; the ramp is PAUSED before each fault' if args.paused else ''}", flush=True)
        route, cand = world.routes["llama"], world.pools["cand"]
        early = 0
        for round_no in range(1, args.rounds + 1):
            e2e.set_fault(world.sim.url("cand"), added_latency_ms=0)
            if round_no > 1:
                # The guard reads whole telemetry windows that overlap its own: the last
                # round's slow answers stay in the window they fell in. Let two go by.
                time.sleep(2 * settings.TELEMETRY_WINDOW_S)
            route.refresh_from_db()
            ramp = ramp_create(actor=world.actor, route=route, pool=cand,
                               steps=[{"percent": args.percent, "hold_s": 3600}],
                               min_samples=args.min_samples, window_s=args.window_s,
                               failure_threshold=args.failure_threshold,
                               reason=f"benchmark round {round_no}", **e2e.THRESHOLDS)
            e2e.wait_for(lambda r=ramp: _watching(r, args.window_s), timeout_s=120,
                         what="the ramp to judge a clean window")
            if args.paused:
                ramp_pause(actor=world.actor, ramp=Ramp.objects.get(pk=ramp.pk),
                           reason="benchmark: a person pauses before the fault")
            fault_at = time.time()
            e2e.set_fault(world.sim.url("cand"), added_latency_ms=args.added_latency_ms)
            e2e.wait_for(lambda r=ramp: not Ramp.objects.get(pk=r.pk).active, timeout_s=180,
                         what="the ramp to finish")
            ramp.refresh_from_db()
            if ramp.state != "rolled-back" or ramp.drain_id is None:
                print(f"round {round_no}: ramp ended {ramp.state} ({ramp.state_reason})",
                      flush=True)
                continue
            drain = e2e.wait_for(
                lambda r=ramp: Drain.objects.filter(pk=r.drain_id,
                                                    verified_at__isnull=False).first(),
                timeout_s=120, what="the drain to be verified")
            rollback = ramp.events.get(kind="rollback").at.timestamp()
            if rollback < fault_at:
                early += 1
                print(f"round {round_no}: rolled back {fault_at - rollback:.1f} s BEFORE the "
                      f"fault (a false rollback): {ramp.state_reason}", flush=True)
                continue
            decided.append(rollback - fault_at)
            drained.append(drain.verified_at.timestamp() - fault_at)
            held = [e2e.envoy_weights(envoy, "llama").get("cand", 0) for envoy in world.envoys]
            print(f"round {round_no}: fault → rollback {decided[-1]:.1f} s, → drained on "
                  f"every gateway {drained[-1]:.1f} s (candidate weight now {held})",
                  flush=True)
            e2e.set_fault(world.sim.url("cand"), added_latency_ms=0)
    finally:
        world.close()
    print(f"\n{len(drained)}/{args.rounds} rounds rolled back by the guard after the fault, "
          f"{early} before it, in {time.monotonic() - began:.0f} s")
    if drained:
        print(f"fault → rollback decision: median {statistics.median(decided):.1f} s, "
              f"max {max(decided):.1f} s")
        print(f"fault → drained on every gateway: median {statistics.median(drained):.1f} s, "
              f"max {max(drained):.1f} s (target ≤ 30 s)")
    print(f"logs: {work}")


def _watching(ramp: Any, window_s: int) -> bool:
    """The step is set and two whole windows have passed on it: the guard has judged a clean
    window, so the fault starts on a ramp that is watching, not on one still waiting."""
    from django.utils import timezone

    ramp.refresh_from_db()
    if ramp.step_index < 0 or ramp.step_started_at is None:
        return False
    return (timezone.now() - ramp.step_started_at).total_seconds() > 2 * window_s


if __name__ == "__main__":
    main()
