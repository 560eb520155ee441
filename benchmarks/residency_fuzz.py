"""Does any sequence of registry and traffic changes send pinned traffic across a border?

Random sequences (hypothesis, the machine of tests/traffic/residency_machine.py) of split
changes, pool and route drains, restores, pool registration, deletion, renames, region moves,
jurisdiction changes, endpoint changes, mirroring, guarded ramps (started, paused, resumed,
aborted, their holds skipped), routes' health policies and a migration plan per sequence
(opened, advanced through its gates, regressed, paused, resumed, abandoned), the REST calls
sent as an admin's token over HTTP
to the real web server (gunicorn); the ramp controller's ticks (on telemetry written for the
hold) and pools' health flips (the probe's results, the health policy's drains and restores)
run in this process, as the worker and the prober run them. After every step, and again once
the pushes have landed, the real Envoy's routes and cluster endpoints are read through its
admin API: a crossing is a pinned route with weight on a pool, or an endpoint, registered
outside its pin (or a ramp out of a pin accepted), or weight on a plan's candidate that its
stage does not allow (issue 16's stage rules). Reported: sequences tried, steps, answers by
status, what the ramps, the health policy and the plans did, crossings (target 0), run time.

Everything real: PostgreSQL (`DATABASE_URL`, default a local `fleetctl_bench_residency`),
Redis (db 8), gunicorn, a Celery worker, Envoy.

    .venv/bin/python benchmarks/residency_fuzz.py [--sequences 1000] [--steps 10]
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def setup_env() -> None:
    os.environ.setdefault("DATABASE_URL",
                          "postgres://postgres@127.0.0.1:5432/fleetctl_bench_residency")
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/8")
    from fleetctl.demo.devstack import local_destinations
    local_destinations(os.environ)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "benchmark-only")
    from benchmarks.overview_and_pools_api import ensure_database

    ensure_database(os.environ["DATABASE_URL"])


class HttpApi:
    """The REST calls the state machine makes, over HTTP to gunicorn, counted by status."""

    def __init__(self, base_url: str, token: str) -> None:
        import httpx

        self.client = httpx.Client(base_url=base_url, timeout=60,
                                   headers={"Authorization": f"Bearer {token}"})
        self.statuses: Counter[int] = Counter()

    def _count(self, answer: Any) -> Any:
        self.statuses[answer.status_code] += 1
        return answer

    def post(self, path: str, body: dict[str, Any], format: str = "json") -> Any:
        return self._count(self.client.post(path, json=body))

    def patch(self, path: str, body: dict[str, Any], format: str = "json") -> Any:
        return self._count(self.client.patch(path, json=body))

    def delete(self, path: str) -> Any:
        return self._count(self.client.delete(path))


def start(name: str, argv: list[str], work: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(argv, cwd=ROOT, stdout=open(work / f"{name}.log", "wb"),
                            stderr=subprocess.STDOUT, start_new_session=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sequences", type=int, default=1000)
    parser.add_argument("--steps", type=int, default=10, help="steps per sequence")
    args = parser.parse_args()
    setup_env()
    import django

    django.setup()
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test

    from fleetctl.accounts.actor import Actor
    from fleetctl.accounts.services import token_create_personal
    from fleetctl.celery import app
    from fleetctl.core.ports import free_port
    from fleetctl.demo.envoy_process import EnvoyProcess
    from fleetctl.traffic.services import gateway_create
    from tests.traffic.residency_machine import make_machine

    call_command("migrate", verbosity=0)
    call_command("flush", interactive=False, verbosity=0)
    work = Path(tempfile.mkdtemp(prefix="fleetctl-residency-fuzz-"))
    envoy = EnvoyProcess(work / "envoy", free_port(), free_port()).start(timeout_s=60)
    web_port = free_port()
    children = [
        start("web", [sys.executable, "-m", "gunicorn", "fleetctl.wsgi", "-b",
                      f"127.0.0.1:{web_port}", "-w", "2", "--threads", "4"], work),
        start("worker", [sys.executable, "-m", "celery", "-A", "fleetctl", "worker", "-Q",
                         "default,push,watch", "-c", "8", "--pool", "threads", "--without-gossip",
                         "--without-mingle", "-n", f"fuzz-{os.getpid()}@%h"], work),
    ]
    try:
        deadline = time.monotonic() + 60
        while not app.control.ping(timeout=0.5):
            if time.monotonic() > deadline:
                raise SystemExit(f"worker did not start; see {work / 'worker.log'}")
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{web_port}/api/v1/", timeout=2)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"web did not start; see {work / 'web.log'}") from None
                time.sleep(0.2)
        admin = User.objects.create_user("fuzz-admin", password="unused-" + os.urandom(8).hex())
        admin.groups.set([Group.objects.get_or_create(name="admin")[0]])
        token = token_create_personal(actor=Actor(user=admin), name="fuzz",
                                      scopes=["read", "ramp", "drain", "fleet"]).secret
        api = HttpApi(f"http://127.0.0.1:{web_port}", token)
        system = Actor.for_system("benchmark")
        gateway = gateway_create(actor=system, name="fuzz-edge", kind="envoy",
                                 admin_address=envoy.admin_url,
                                 options={"config_dir": str(envoy.workdir),
                                          "load_timeout_s": 30})
        found: list[str] = []
        began = time.monotonic()

        def numbered() -> Iterator[int]:
            """Sequence numbers, with a progress line every 50 (a long run can be read
            while it goes)."""
            for n in itertools.count(1):
                if n % 50 == 1 and n > 1:
                    print(f"  {n - 1} sequences, {len(found)} crossings, "
                          f"{time.monotonic() - began:.0f} s", flush=True)
                yield n

        numbers = numbered()
        machine = make_machine(api, gateway, numbers, on_crossing=found.extend)
        run_state_machine_as_test(machine, settings=settings(
            max_examples=args.sequences, stateful_step_count=args.steps, deadline=None,
            database=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
        took = time.monotonic() - began
        tried = next(numbers) - 1
        print(f"sequences tried:   {tried} (up to {args.steps} steps each)")
        print(f"REST answers:      {sum(api.statuses.values())} "
              f"({', '.join(f'{k}: {v}' for k, v in sorted(api.statuses.items()))})")
        from fleetctl.fleet.models import HealthTransition
        from fleetctl.ramps.models import Ramp, RampEvent
        from fleetctl.traffic.models import Drain

        kinds = Counter(RampEvent.objects.values_list("kind", flat=True))
        states = Counter(Ramp.objects.values_list("state", flat=True))
        print(f"ramps:             {sum(states.values())} started "
              f"({', '.join(f'{k}: {v}' for k, v in sorted(states.items()))}); "
              f"{kinds['step']} steps set, {kinds['pass']} holds passed, {kinds['skip']} "
              f"skipped, {kinds['pause']} paused (refused steps among them), "
              f"{kinds['manual-change']} paused by a manual change")
        automatic = Counter(Drain.objects.filter(health_transition__isnull=False)
                            .values_list("action", flat=True))
        flips = Counter(HealthTransition.objects.exclude(from_state="unknown")
                        .values_list("to_state", flat=True))
        print(f"health policy:     {flips['unhealthy']} pools flipped unhealthy, "
              f"{flips['healthy']} back; {automatic['drain']} drains, "
              f"{automatic['restore']} restores")
        from migrations_plan.models import Plan, StageMove

        moves = Counter(StageMove.objects.values_list("kind", flat=True))
        stages = Counter(Plan.objects.values_list("state", flat=True))
        drained = StageMove.objects.filter(drains__isnull=False).distinct().count()
        print(f"plans:             {sum(stages.values())} opened (now "
              f"{', '.join(f'{k}: {v}' for k, v in sorted(stages.items()))}); moves "
              f"{', '.join(f'{k}: {v}' for k, v in sorted(moves.items()))}; {drained} "
              f"drained the candidate")
        print(f"crossings:         {len(found)} (target 0; borders and stage rules)")
        for line in found[:20]:
            print(f"  {line}")
        print(f"run time:          {took:.0f} s ({took / max(tried, 1) * 1000:.0f} ms a sequence)")
    finally:
        for child in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGTERM)
        for child in children:
            child.wait(timeout=30)
        envoy.stop()


if __name__ == "__main__":
    main()
