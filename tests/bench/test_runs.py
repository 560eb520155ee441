"""Benchmark runs end to end: a real Celery worker (bench queue) replays a trace against
simulated pools, sweeps levels, merges shards exactly, derives cost per 1M output tokens and
records gate evidence."""

from __future__ import annotations

import io
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from fleetctl.bench import services, stats
from fleetctl.bench.models import Level, Run, Sample, ShardPart
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_model_create
from migrations_plan.models import Evidence
from tests.conftest import wait_until

pytestmark = pytest.mark.slow
MODEL = "llama-3.1-8b-instruct"
SLO = {"slo_ttft_p95_ms": 2000, "slo_tpot_p95_ms": 200, "slo_error_rate": 0.05}
FAST = {"warmup_s": 0.5, "window_s": 2.0, "min_samples": 8, "lag_limit_ms": 500}


@pytest.fixture
def bench_pools(bench_sim, make_pool, system):
    pools = {}
    for name, rate in (("paced", "39.80"), ("faulty", "31.20")):
        pool = make_pool(name=name, base_urls=[bench_sim.url(name)], node_hourly_rate=rate)
        pool_model_create(actor=system, pool=pool, model_id=MODEL, max_context_tokens=8192)
        pools[name] = pool
    return pools


@pytest.fixture
def trace(system):
    return services.trace_generate(actor=system, name="short-chat", n=200, seed=7,
                                   prompt_tokens={"kind": "uniform", "lo": 50, "hi": 150},
                                   completion_tokens={"kind": "uniform", "lo": 16, "hi": 32},
                                   arrival={"kind": "poisson", "rate": 50.0})


def test_a_run_measures_levels_derives_cost_and_records_evidence(
    celery_worker, bench_pools, trace, system
):
    run = services.run_create(actor=system, trace=trace, pools=[bench_pools["paced"]],
                              model_id=MODEL, mode="levels", levels=[1, 4], **SLO, **FAST)
    wait_until(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, timeout_s=90,
               what="the run to finish")
    run.refresh_from_db()
    assert run.status == "complete", (run.status, run.error)
    levels = {lv.concurrency: lv for lv in Level.objects.filter(run=run)}
    assert set(levels) == {1, 4}
    for level in levels.values():
        assert level.verdict == "pass", level.note
        assert level.summary["n_ok"] >= 8
    assert levels[4].output_tokens_per_s > levels[1].output_tokens_per_s
    best = levels[4]
    expected = stats.cost_per_1m(Decimal("39.80"), best.output_tokens_per_s)
    assert best.cost_per_1m == expected
    pool = Pool.objects.get(name="paced")
    assert pool.cost_per_1m_output_tokens == expected
    evidence = Evidence.objects.get(kind="benchmark", pool=pool)
    assert evidence.verdict == "pass" and evidence.data["best_concurrency"] == 4
    assert evidence.data["slo"]["ttft_p95_ms"] == 2000


def test_a_level_split_over_two_workers_is_merged_exactly(
    celery_worker, bench_pools, trace, system
):
    run = services.run_create(actor=system, trace=trace, pools=[bench_pools["paced"]],
                              model_id=MODEL, mode="levels", levels=[6], shards=2, **SLO,
                              **FAST)
    wait_until(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, timeout_s=90,
               what="the sharded run to finish")
    level = Level.objects.get(run=run)
    parts = list(ShardPart.objects.filter(level=level).order_by("shard"))
    assert [(p.shard, p.concurrency, p.error) for p in parts] == [(0, 3, ""), (1, 3, "")]
    assert {s.shard for s in Sample.objects.filter(level=level)} == {0, 1}
    # The stored summary is the summary of all raw samples together, not a blend of two.
    ok = sorted(s.ttft_s for s in Sample.objects.filter(level=level, status="ok", warmup=False))
    assert level.summary["ttft_p95_s"] == stats.percentile(ok, 95)
    assert level.summary["n_ok"] == len(ok)
    # Rates add up across the two client processes (each over its own window).
    assert all(p.window_tokens > 0 for p in parts)
    assert level.output_tokens_per_s == pytest.approx(
        sum(p.window_tokens / p.window_s for p in parts), rel=1e-9)


def test_a_pool_that_is_down_fails_its_levels_with_the_reason(celery_worker, make_pool,
                                                              system, trace):
    down = make_pool(name="down", base_urls=["http://127.0.0.1:9"])
    pool_model_create(actor=system, pool=down, model_id=MODEL, max_context_tokens=8192)
    run = services.run_create(actor=system, trace=trace, pools=[down], model_id=MODEL,
                              mode="levels", levels=[2], **SLO, **FAST)
    wait_until(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, timeout_s=90,
               what="the run to finish")
    level = Level.objects.get(run=run)
    assert level.verdict == "fail"
    assert level.error_rate == 1.0
    assert "down or unreachable" in Sample.objects.filter(level=level).first().error
    assert Evidence.objects.get(pool=down, kind="benchmark").verdict == "fail"
    assert Pool.objects.get(pk=down.pk).cost_per_1m_output_tokens is None


def test_bad_run_requests_are_refused(db, bench_pools, trace, system, make_pool):
    other = make_pool(name="no-model")
    with pytest.raises(ValidationError, match="no-model do\\(es\\) not serve"):
        services.run_create(actor=system, trace=trace, pools=[other], model_id=MODEL, **SLO)
    with pytest.raises(ValidationError, match="positive integers"):
        services.run_create(actor=system, trace=trace, pools=[bench_pools["paced"]],
                            model_id=MODEL, mode="levels", levels=[0, 2], **SLO)
    with pytest.raises(ValidationError):
        services.run_create(actor=system, trace=trace, pools=[bench_pools["paced"]],
                            model_id=MODEL, slo_ttft_p95_ms=-1, slo_tpot_p95_ms=1,
                            slo_error_rate=0.01)
    assert not Run.objects.exists()


def test_an_upload_with_bad_lines_names_them_and_keeps_nothing(db, system):
    body = (b'{"prompt_tokens": 10, "completion_tokens": 5, "arrival_s": 0}\n'
            b'{"prompt_tokens": -1, "completion_tokens": 5, "arrival_s": 1}\n')
    with pytest.raises(ValidationError) as refused:
        services.trace_upload(actor=system, name="bad", fileobj=io.BytesIO(body))
    assert "line 2" in str(refused.value)
    from fleetctl.bench.models import Trace
    assert not Trace.objects.exists()


def test_a_run_whose_worker_died_is_failed_by_the_reaper(db, bench_pools, trace, system):
    from datetime import timedelta

    from django.utils import timezone

    run = Run.objects.create(trace=trace, model_id=MODEL, status="running", created_by="x",
                             heartbeat_at=timezone.now() - timedelta(minutes=10),
                             slo_ttft_p95_ms=1, slo_tpot_p95_ms=1, slo_error_rate=0)
    Level.objects.create(run=run, pool=bench_pools["paced"], concurrency=4)
    assert services.runs_reap() == 1
    run.refresh_from_db()
    assert run.status == "failed" and "no heartbeat since" in run.error
    assert Level.objects.get(run=run).verdict == "error"


def test_a_run_no_worker_ever_started_is_failed_with_the_reason(db, bench_pools, trace,
                                                               system):
    from datetime import timedelta

    from django.utils import timezone

    run = Run.objects.create(trace=trace, model_id=MODEL, status="queued", created_by="x",
                             slo_ttft_p95_ms=1, slo_tpot_p95_ms=1, slo_error_rate=0)
    Run.objects.filter(pk=run.pk).update(created_at=timezone.now() - timedelta(hours=1))
    assert services.runs_reap() == 1
    assert "consuming the bench queue" in Run.objects.get(pk=run.pk).error


def test_reserved_trace_names_are_refused(db, system):
    with pytest.raises(ValidationError, match="reserved"):
        services.trace_generate(actor=system, name="upload", n=5)
