"""The real parts a guarded ramp runs on, for the end-to-end tests (tests/ramps/test_e2e_*.py)
and the ramp benchmarks (benchmarks/ramp_*.py): simulated pools, a real Envoy writing its
access log, the telemetry ingester process following it, streamed chat traffic sent with the
`openai` client at a fixed rate, and a loop sending `ramps.tick` to the Celery worker every
RAMP_TICK_INTERVAL_S, as beat does. Nothing here is pytest-specific: a benchmark builds the
same world with its own database and worker.
"""

from __future__ import annotations

import functools
import logging
import subprocess
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai

from tests.support.celery_worker import start_celery_worker
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until
from tests.telemetry.lines import start_ingester

ROOT = Path(__file__).resolve().parents[2]
MODEL = "llama-3.1-8b-instruct"

# The pools are "quick" ones: a few ms to the first token, no replica noise, so an A/A pair
# is truly alike and +300 ms to the first token is far outside anything they do by themselves.
PROFILES = TEST_PROFILES  # the tests' one profile set (benchmarks/ramp_*.py read it here)

# Thresholds of the ramps in these tests: TTFT p95 is a few ms on a quiet machine but reaches
# 200–450 ms on both pools alike when the 2 shared cores are saturated (measured); +300 ms on
# every answer puts even the lower bound of the candidate's p95 over 250 ms, load or not.
THRESHOLDS: dict[str, Any] = {"slo_ttft_p95_ms": 250.0, "slo_tpot_p95_ms": 50.0,
                              "slo_error_rate": 0.05, "latency_margin_pct": 100.0}


# The tests' one wait helper, by the name benchmarks/ramp_*.py call it, looking every 0.2 s
# (the ramp world keeps both cores busy: no need to look more often).
wait_for = functools.partial(wait_until, every_s=0.2)


# --- traffic -----------------------------------------------------------------------------------

@dataclass
class Traffic:
    """Streamed chat requests through a gateway at `rps`, each on a small thread pool, from a
    thread of its own; counts answers by outcome. `route_headers` picks a route (residency)."""

    url: str
    rps: float
    threads: int = 16
    max_tokens: int = 16
    model: str = MODEL
    headers: dict[str, str] = field(default_factory=dict)
    outcomes: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        # Hundreds of requests: one INFO line each would drown a failing test's output.
        for name in ("httpx", "httpx2"):
            logging.getLogger(name).setLevel(logging.WARNING)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._client = openai.OpenAI(base_url=f"{self.url}/v1", api_key="e2e", max_retries=0,
                                     timeout=30.0, default_headers=self.headers or None)
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="e2e-traffic")
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> Traffic:
        self._thread.start()
        return self

    def _one(self, i: int) -> None:
        try:
            stream = self._client.chat.completions.create(
                model=self.model, messages=[{"role": "user", "content": f"question {i}"}],
                max_tokens=self.max_tokens, stream=True, temperature=0)
            chunks = sum(1 for chunk in stream if chunk.choices and chunk.choices[0].delta.content)
            outcome = "ok" if chunks else "empty"
        except openai.APIStatusError as exc:
            outcome = f"HTTP {exc.status_code}"
        except Exception as exc:  # every failure counts, whatever it is
            outcome = type(exc).__name__
        with self._lock:
            self.outcomes[outcome] += 1

    def _run(self) -> None:
        next_at, i = time.monotonic(), 0
        while not self._stop.is_set():
            self._pool.submit(self._one, i)
            i += 1
            next_at += 1 / self.rps
            self._stop.wait(max(0.0, next_at - time.monotonic()))

    def stop(self) -> Counter[str]:
        self._stop.set()
        self._thread.join(timeout=10)
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._client.close()
        with self._lock:
            return Counter(self.outcomes)


# --- processes --------------------------------------------------------------------------------

class Ingester:
    """`python -m fleetctl.telemetry.ingest` on the given environment (the test database)."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env, self.log = env, log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Ingester:
        """Returns once the ingester joined (it took the shards free then: it is reading)."""
        since = self.log.stat().st_size if self.log.exists() else 0
        self.proc = proc = start_ingester(self.log, env=self.env)

        def reading() -> bool:
            if proc.poll() is not None:
                raise RuntimeError(f"the ingester exited with {proc.returncode}: "
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            with self.log.open("rb") as log:
                log.seek(since)
                return b"joined the ingesters" in log.read()

        wait_until(reading, timeout_s=60, what="the ingester to join",
                   explain=lambda: self.log.read_text(errors="replace")[-2000:])
        return self

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_worker(env: dict[str, str], log: Path, *, name: str,
                 queues: str = "watch,push,default") -> subprocess.Popen[bytes]:
    """A Celery worker of our own (threads, as the demo's), answering a ping before return."""
    return start_celery_worker(env, log, node=f"{name}@%h", queues=queues.split(","),
                               concurrency=8)


class TickLoop:
    """What beat does for ramps: send `ramps.tick` every `every_s` (to the watch queue)."""

    def __init__(self, every_s: float | None = None, task: str = "ramps.tick") -> None:
        from django.conf import settings

        self.every_s = every_s or float(settings.RAMP_TICK_INTERVAL_S)
        self.task = task  # or "ramps.watch_tick": the standing watches' beat entry
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> TickLoop:
        self._thread.start()
        return self

    def _run(self) -> None:
        from fleetctl.celery import app

        while not self._stop.is_set():
            # Expires like beat's entry would be superseded: a backlog of ticks is useless.
            app.send_task(self.task, expires=self.every_s * 2)
            self._stop.wait(self.every_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# --- the world --------------------------------------------------------------------------------

def set_fault(url: str, **faults: Any) -> None:
    answer = httpx.post(f"{url}/admin/faults", json=faults, timeout=5)
    answer.raise_for_status()


def make_pools(actor: Any, sims: Any, names: list[str], region: Any) -> dict[str, Any]:
    """Pool rows for simulated pools, serving MODEL, healthy (one good probe recorded)."""
    from fleetctl.fleet.services import pool_create, pool_health_record, pool_model_create

    pools = {}
    for name in names:
        pool = pool_create(actor=actor, name=name, runtime="cuda", accelerator="H200",
                           region=region, base_urls=[sims.url(name)], max_context_tokens=4096,
                           node_hourly_rate="10.00")
        pool_model_create(actor=actor, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
        pools[name] = pool
    return pools


def make_gateway(actor: Any, envoy: Any, routes: list[Any], name: str = "envoy-e2e") -> Any:
    """The Gateway row for a running EnvoyProcess, with its access log as the `access_log`
    option, and its first push verified."""
    from fleetctl.traffic.models import GatewayPush
    from fleetctl.traffic.services import gateway_create

    gateway = gateway_create(actor=actor, name=name, kind="envoy",
                             admin_address=envoy.admin_url,
                             options={"config_dir": str(envoy.workdir), "load_timeout_s": 30,
                                      "access_log": str(envoy.workdir / "access.log")},
                             routes=routes)
    wait_for(lambda: not GatewayPush.objects.filter(gateway=gateway)
             .exclude(status__in=["verified", "superseded"]).exists(),
             timeout_s=60, what="the gateway's first push to verify")
    return gateway


def envoy_weights(envoy: Any, route: str) -> dict[str, float]:
    """What Envoy itself holds for a route, in percent (its runtime read back through the
    admin API, in basis points)."""
    from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter

    held = EnvoyAdapter(envoy.gateway("read-back", load_timeout_s=30)).read_back()
    return {pool: bp / 100 for pool, bp in held.get(route, {}).items()}


def ramp_events(ramp: Any) -> list[str]:
    return list(ramp.events.order_by("at", "id").values_list("kind", flat=True))


def explain(ramp: Any) -> str:
    """A ramp's timeline in a failure message."""
    ramp.refresh_from_db()
    lines = [f"ramp {ramp.pk}: {ramp.state} step {ramp.step_index} ({ramp.state_reason})"]
    lines += [f"  {e.at:%H:%M:%S} {e.kind} {e.percent} {e.message}"
              for e in ramp.events.order_by("at", "id")]
    return "\n".join(lines)
