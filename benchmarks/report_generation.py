"""Migration report generation for a plan with a month of history (issue 29): the demo's
MI300X plan (`demo_seed`, on a fresh PostgreSQL database) given 30 days of evidence about
both pools (a benchmark, a conformance probe and an eval run a day, recorded through the
evidence service and dated back a day each), its gates signed off up to stage 4 and a drain
drill a day (pause, which drains the candidate, and resume: 30 drains and 60 stage moves), and
30 days of 10-minute telemetry windows per pool and its gateway. Then the HTML
page and the PDF are fetched through gunicorn (one worker, as benchmarks/batch_input_memory.py
starts it), each several times: medians, and the PDF's size. "pdf" is made each time (the
kept PDFs cleared first); "pdf again" is what a second download of unchanged rows costs (the
PDF kept by its rows hash: a build and a cache read).

    .venv/bin/python benchmarks/report_generation.py [--runs 7]
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

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/fleetctl_bench_report"
PLAN = "mi300x-llama-8b"
DAYS = 30


def setup_django(database_url: str) -> dict[str, str]:
    import psycopg

    os.environ["DATABASE_URL"] = database_url
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/12")  # cleared below
    from fleetctl.demo.devstack import local_destinations

    local_destinations(os.environ)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")
    os.environ["DEBUG"] = "0"
    os.environ.setdefault("SECRET_KEY", "benchmark-only")
    name = database_url.rsplit("/", 1)[1]
    with psycopg.connect(database_url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                     "WHERE datname = %s AND pid <> pg_backend_pid()", [name])
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    return {**os.environ, "PYTHONPATH": str(REPO)}


def seed(password: str) -> dict[str, int]:
    import io
    from datetime import timedelta

    from django.core.management import call_command
    from django.utils import timezone

    from fleetctl.accounts.actor import Actor
    from fleetctl.telemetry.models import Window
    from migrations_plan import services as plans
    from migrations_plan.models import Approval, Evidence, Plan

    call_command("demo_seed", "--password", password, "--sim-base-port", "8100",
                 "--gateway-admin", "http://127.0.0.1:1", "--gateway-config-dir",
                 tempfile.mkdtemp(prefix="fleetctl-bench-report-"), stdout=io.StringIO(),
                 stderr=io.StringIO())
    plan = Plan.objects.select_related("candidate_pool", "primary_pool").get(name=PLAN)
    now = timezone.now()
    for day in range(DAYS, 0, -1):
        for pool in (plan.candidate_pool, plan.primary_pool):
            rows = [
                plans.evidence_record(actor=Actor.for_system("conformance-probe"), pool=pool,
                                      kind="conformance", verdict="pass",
                                      summary=f"OpenAI contract: 42 of 42 probes pass (day "
                                              f"{day})"),
                plans.evidence_record(actor=Actor.for_system("eval-runner"), pool=pool,
                                      kind="eval", verdict="pass",
                                      summary=f"{400 + day}/420 eval cases"),
            ]
            rows.append(plans.evidence_record(
                actor=Actor.for_system("benchmark"), pool=pool, kind="benchmark",
                verdict="pass", summary=f"run {1000 + day}", data=_bench_data(pool, day)))
            # Dated back: a history, as if recorded that day (the rows are otherwise
            # immutable; only this seed rewrites their time).
            Evidence.objects.filter(pk__in=[r.pk for r in rows]).update(
                observed_at=now - timedelta(days=day))
    # Its gates signed off as people would (attest what needs a person, lead2 approves with a
    # justification, advance) up to stage 4; then a drill a day: pause (which drains the
    # candidate off the route: a drain record each) and resume.
    from django.contrib.auth.models import User

    from migrations_plan.models import GateCheck

    people = {name: Actor(user=User.objects.get(username=name))
              for name in ("lead", "lead2", "oncall", "admin")}
    attester = {"platform-lead": "lead2", "on-call": "oncall"}
    while plan.stage < 4:
        for check in plan.checks.filter(stage=plan.stage, removed_at__isnull=True,
                                        kind=GateCheck.Kind.ATTESTED):
            plans.attest(actor=people[attester.get(check.attest_role, "admin")], check=check,
                         note=f"confirmed for stage {plan.stage} (benchmark seed)")
        plans.approve(actor=people["lead2"], plan=plan,
                      justification="benchmark seed: signed off on the evidence shown")
        plan = plans.advance(actor=people["lead2"], plan=plan, reason="gate passed")
    from fleetctl.fleet.services import pool_health_record
    from fleetctl.traffic import services as traffic
    from fleetctl.traffic.models import Route

    for _ in range(2):  # the simulators are not running: the candidate must be healthy to
        # carry weight, as its health checks would say if they were
        pool_health_record(pool_id=plan.candidate_pool.pk, ok=True, status_code=200,
                           latency_ms=1.0)
    for day in range(DAYS):
        route = Route.objects.get(name="llama-8b")
        traffic.revision_create(
            actor=people["oncall"], route=route, base_revision=route.revision_number,
            weights={plan.primary_pool.name: 90, plan.candidate_pool.name: 10},
            reason=f"10 % live, day {day}")
        plan = plans.pause(actor=people["oncall"], plan=plan, reason=f"drain drill, day {day}")
        plan = plans.resume(actor=people["lead"], plan=plan, reason=f"drill {day} over")
    windows = []
    start = (now - timedelta(days=DAYS)).replace(minute=0, second=0, microsecond=0)
    slots = DAYS * 24 * 6
    for pool in (plan.candidate_pool.name, plan.primary_pool.name):
        for i in range(slots):
            at = start + timedelta(seconds=600 * i)
            windows.append(Window(source=Window.Source.POOL, source_name=pool, pool=pool,
                                  resolution_s=600, start=at, requests=1200,
                                  output_tokens=600_000, metered_ms=600_000,
                                  running_sum=24 * 60, running_samples=60))
            windows.append(Window(source=Window.Source.GATEWAY, source_name="envoy-us",
                                  route="llama-8b", pool=pool, resolution_s=600, start=at,
                                  requests=1200, errors=3, streamed=1200))
    Window.objects.bulk_create(windows, batch_size=5000, ignore_conflicts=True)
    return {"evidence": Evidence.objects.filter(pool__in=[plan.candidate_pool,
                                                         plan.primary_pool]).count(),
            "windows": Window.objects.filter(pool__in=[plan.candidate_pool.name,
                                                       plan.primary_pool.name]).count(),
            "approvals": Approval.objects.filter(plan=plan).count(),
            "moves": plan.moves.count(), "drains": plan.moves.filter(kind="pause").count()}


def make_token() -> str:
    """A read-only personal token of the demo's viewer (whoever may read the plan)."""
    from django.contrib.auth.models import User

    from fleetctl.accounts.actor import Actor
    from fleetctl.accounts.services import token_create_personal

    return token_create_personal(actor=Actor(user=User.objects.get(username="viewer")),
                                 name="bench-report", scopes=["read"]).secret


def _bench_data(pool: Any, day: int) -> dict[str, object]:
    """A benchmark run's evidence data (bench/services/worker.py, benchmark_evidence_data's
    shape): both pools on one trace and SLO, a five-level sweep."""
    from datetime import date, timedelta

    from fleetctl.fleet.costs import cost_per_1m

    name = pool.name
    tokens = 2400.0 if "mi300x" in name else 2600.0
    levels = [{"concurrency": c, "speed": None, "verdict": "pass" if c <= 16 else "fail",
               "ttft_p95_ms": 90.0 * c, "tpot_p95_ms": 2.5 * c,
               "output_tokens_per_s": tokens * c / 16} for c in (2, 4, 8, 16, 32)]
    rate = pool.node_hourly_rate
    return {"run": 1000 + day, "timing": "concurrency", "best_concurrency": 16,
            "best_speed": None, "output_tokens_per_s": tokens,
            "cost_per_1m": str(cost_per_1m(rate, tokens)), "binding": "tpot_p95",
            "hourly_rate": str(rate), "currency": pool.currency,
            "measured_on": (date.today() - timedelta(days=day)).isoformat(),
            "slo": {"ttft_p95_ms": 800, "tpot_p95_ms": 60, "error_rate": 0.01},
            "window_s": 60.0, "warmup_s": 10.0, "client_bound": False, "trace": "demo-chat",
            "trace_sha256": "ab" * 32, "pools": ["h200-us-east", "mi300x-us-east"],
            "endpoints": 1, "levels": levels}


def start_web(env: dict[str, str], log: Path) -> tuple[subprocess.Popen[bytes], str]:
    import httpx

    from fleetctl.core.ports import free_port

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "fleetctl.wsgi", "-b", f"127.0.0.1:{port}",
         "-w", "1", "--threads", "2", "--timeout", "300"],
        cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:  # until it answers (a condition, not a fixed wait)
        try:
            httpx.get(f"{url}/api/v1/", timeout=2)
            return proc, url
        except httpx.HTTPError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise SystemExit(f"web did not start; see {log}") from None
            time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--database-url", default=os.environ.get("BENCH_DATABASE_URL",
                                                                 DEFAULT_DB))
    args = parser.parse_args()
    import httpx

    password = "bench-" + os.urandom(6).hex()
    env = setup_django(args.database_url)
    began = time.perf_counter()
    counts = seed(password)
    print(f"report_generation: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}; "
          f"plan {PLAN}: {counts['evidence']} evidence rows, {counts['windows']} telemetry "
          f"windows, {counts['approvals']} approvals, {counts['moves']} stage moves, "
          f"{counts['drains']} drains (seeded in "
          f"{time.perf_counter() - began:.0f} s)", flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_web(env, Path(tmp) / "web.log")
        try:
            with httpx.Client(base_url=url, timeout=300,
                              headers={"Authorization": f"Bearer {make_token()}"}) as client:
                from django.core.cache import cache

                results: dict[str, list[float]] = {"html": [], "pdf": [], "pdf again": []}
                size = {}
                for key in results:
                    fmt = key.split()[0]
                    path = f"/api/v1/plans/{PLAN}/report/?format={fmt}"
                    client.get(path).raise_for_status()  # warm: imports, fonts
                    for _ in range(args.runs):
                        if key == "pdf":  # made each time: no PDF of these rows is kept
                            cache.clear()
                        t0 = time.perf_counter()
                        answer = client.get(path)
                        results[key].append(time.perf_counter() - t0)
                        answer.raise_for_status()
                        size[key] = len(answer.content)
                for key, times in results.items():
                    print(f"{key}: median {statistics.median(times) * 1000:,.0f} ms over "
                          f"{len(times)} runs (min {min(times) * 1000:,.0f}, max "
                          f"{max(times) * 1000:,.0f}); {size[key] / 1024:,.0f} KiB",
                          flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
