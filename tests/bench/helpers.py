"""Benchmark records made directly, for the API, dashboard and CLI tests that read them: a
finished two-pool run with known numbers, without measuring anything."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from fleetctl.accounts.actor import Actor
from fleetctl.bench import services
from fleetctl.bench.models import Level, Run, Sample, Trace
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_model_create

MODEL = "llama-3.1-8b-instruct"
SLO = {"slo_ttft_p95_ms": 2000.0, "slo_tpot_p95_ms": 200.0, "slo_error_rate": 0.05}
SYSTEM = Actor.for_system("test")
GOOD_LINE = b'{"prompt_tokens": 10, "completion_tokens": 5, "arrival_s": 0}\n'
BAD_LINE = b'{"prompt_tokens": -1, "completion_tokens": 5, "arrival_s": 1}\n'


def serving(make_pool: Any, name: str, rate: str = "39.80", **overrides: Any) -> Pool:
    pool = make_pool(name=name, node_hourly_rate=rate, **overrides)
    pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=8192)
    return pool


def small_trace(name: str = "short-chat", n: int = 50) -> Trace:
    return services.trace_generate(actor=SYSTEM, name=name, n=n, seed=7,
                                   prompt_tokens={"kind": "uniform", "lo": 50, "hi": 150},
                                   completion_tokens={"kind": "uniform", "lo": 16, "hi": 32},
                                   arrival={"kind": "poisson", "rate": 50.0})


def _summary(ttft_p95_s: float, tpot_p95_s: float, n_ok: int, **extra: Any) -> dict[str, Any]:
    return {"n_ok": n_ok, "n_errors": 0, "n_timeouts": 0, "n_warmup": 2,
            "n_tokens_fallback": 0, "error_rate": 0.0, "ttft_p50_s": ttft_p95_s / 2,
            "ttft_p95_s": ttft_p95_s, "ttft_p99_s": ttft_p95_s * 1.1,
            "tpot_p50_s": tpot_p95_s / 2, "tpot_p95_s": tpot_p95_s, "itl_p50_s": 0.02,
            "itl_p95_s": 0.03, "itl_p99_s": 0.04, "e2e_p50_s": 0.4, "e2e_p95_s": 0.6,
            "output_tokens_per_s": 100.0, "request_rate_per_s": 4.0,
            "schedule_lag_p50_s": 0.0005, "schedule_lag_p99_s": 0.002, "loop_lag_p99_s": 0.001,
            "client_cpu_share": 0.2, "window_s": 2.0, **extra}


def level(run: Run, pool: Pool, concurrency: int, verdict: str, tok_s: float,
          ttft_ms: float, tpot_ms: float, note: str = "", binding: str = "ttft_p95") -> Level:
    cost = (Decimal(pool.node_hourly_rate) * Decimal(1_000_000) / (Decimal(str(tok_s)) * 3600)
            ).quantize(Decimal("0.0001"))
    row = Level.objects.create(
        run=run, pool=pool, concurrency=concurrency, verdict=verdict, binding=binding,
        output_tokens_per_s=tok_s, ttft_p95_ms=ttft_ms, tpot_p95_ms=tpot_ms, error_rate=0.0,
        cost_per_1m=cost, note=note or f"{verdict} at {concurrency}",
        summary=_summary(ttft_ms / 1000, tpot_ms / 1000, 10 * concurrency))
    for index in range(3):
        Sample.objects.create(level=row, index=index, warmup=index == 0, scheduled_s=index * 0.1,
                              schedule_lag_s=0.001, ttft_s=ttft_ms / 1000, tpot_s=tpot_ms / 1000,
                              e2e_s=0.5, itl_s=[0.02, 0.03, 0.02], input_tokens=100,
                              output_tokens=20, window_tokens=20.0, status="ok",
                              http_status=200)
    return row


def finished_run(trace: Trace, paced: Pool, faulty: Pool) -> Run:
    """paced passes at 1 and 4; faulty passes at 1, fails at 4 on TTFT, and its 16 was
    invalid (the client lagged)."""
    run = Run.objects.create(
        trace=trace, model_id=MODEL, mode="levels", levels=[1, 4, 16], status="complete",
        created_by="test", **SLO,
        progress={"best": {paced.name: 4, faulty.name: 1},
                  "client_bound": {paced.name: False, faulty.name: False},
                  "notes": {paced.name: "", faulty.name: ""}, "doing": "done"})
    run.pools.set([paced, faulty])
    level(run, paced, 1, "pass", 120.0, 300.0, 20.0)
    level(run, paced, 4, "pass", 400.0, 900.0, 40.0, binding="ttft_p95")
    level(run, faulty, 1, "pass", 110.0, 400.0, 25.0)
    level(run, faulty, 4, "fail", 300.0, 2600.0, 60.0, note="ttft_p95 at 1.30× its limit")
    level(run, faulty, 16, "invalid", 500.0, 1900.0, 70.0, binding="client_schedule_lag",
          note="client lag p99 800.0 ms > 500 ms: the client set the pace, not the server")
    return run
