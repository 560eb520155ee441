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
from tests.migrations_plan.conftest import world  # noqa: F401 - the fixture
from tests.support.waiting import wait_until

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
    # Measured by fleetctl, and it names the run that measured it.
    assert evidence.source == f"benchmark run {run.pk}"
    assert evidence.url == f"/bench/runs/{run.pk}/"


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


# --- trace timing ----------------------------------------------------------------------------

def _trace_rate(trace) -> float:
    return trace.summary["mean_request_rate_per_s"]


def test_a_trace_timing_run_replays_the_trace_time_scaled(celery_worker, bench_pools, trace,
                                                          system):
    run = services.run_create(actor=system, trace=trace, pools=[bench_pools["paced"]],
                              model_id=MODEL, timing="trace", speeds=[2, 1], **SLO, **FAST)
    assert run.speeds == [1.0, 2.0] and run.mode == "levels" and run.levels == []
    wait_until(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, timeout_s=90,
               what="the trace-timing run to finish")
    run.refresh_from_db()
    assert run.status == "complete", (run.status, run.error)
    levels = {lv.speed: lv for lv in Level.objects.filter(run=run)}
    assert set(levels) == {1.0, 2.0}
    rate = _trace_rate(trace)
    for speed, level in levels.items():
        assert level.concurrency == 0
        assert level.verdict == "pass", level.note
        assert level.summary["n_ok"] >= 8
        measured = level.summary["request_rate_per_s"]
        assert measured == pytest.approx(rate * speed, rel=0.3), (speed, measured, rate)
        # Open loop: each request went out on its own deadline, not when a slot freed.
        scheduled = sorted(s.scheduled_s for s in Sample.objects.filter(level=level))
        assert scheduled[0] == pytest.approx(0.0, abs=1e-9)
    assert levels[2.0].output_tokens_per_s > levels[1.0].output_tokens_per_s
    best = levels[2.0]
    expected = stats.cost_per_1m(Decimal("39.80"), best.output_tokens_per_s)
    assert best.cost_per_1m == expected
    pool = Pool.objects.get(name="paced")
    assert pool.cost_per_1m_output_tokens == expected
    evidence = Evidence.objects.get(kind="benchmark", pool=pool)
    assert evidence.verdict == "pass" and "trace speed 2×" in evidence.summary
    assert evidence.data["timing"] == "trace" and evidence.data["best_speed"] == 2.0
    assert evidence.data["best_concurrency"] is None
    assert [r.best.speed for r in services.run_results(run)] == [2.0]


def test_a_trace_timing_level_split_over_two_workers_is_merged_exactly(
    celery_worker, bench_pools, trace, system
):
    run = services.run_create(actor=system, trace=trace, pools=[bench_pools["paced"]],
                              model_id=MODEL, timing="trace", speeds=[2], shards=2, **SLO,
                              **FAST)
    wait_until(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, timeout_s=90,
               what="the sharded trace-timing run to finish")
    run.refresh_from_db()
    assert run.status == "complete", (run.status, run.error)
    level = Level.objects.get(run=run)
    assert level.speed == 2.0 and level.concurrency == 0
    parts = list(ShardPart.objects.filter(level=level).order_by("shard"))
    assert [(p.shard, p.concurrency, p.error) for p in parts] == [(0, 0, ""), (1, 0, "")]
    samples = list(Sample.objects.filter(level=level))
    assert {s.shard for s in samples} == {0, 1}
    indexes = [s.index for s in samples]
    assert len(indexes) == len(set(indexes))  # disjoint: no request sent twice
    # Request i of the schedule went to shard i % 2 (the trace has an even length).
    assert all(s.index % 2 == s.shard for s in samples)
    ok = sorted(s.ttft_s for s in samples if s.status == "ok" and not s.warmup)
    assert level.summary["ttft_p95_s"] == stats.percentile(ok, 95)
    assert level.summary["n_ok"] == len(ok)
    # Together the two shards sent the trace's schedule at twice its rate.
    assert level.summary["request_rate_per_s"] == pytest.approx(_trace_rate(trace) * 2,
                                                                rel=0.3)
    assert level.output_tokens_per_s == pytest.approx(
        sum(p.window_tokens / p.window_s for p in parts), rel=1e-9)


def test_trace_shares_keep_the_whole_traces_clock():
    from types import SimpleNamespace

    rows = [SimpleNamespace(prompt_tokens=10, completion_tokens=5, arrival_s=t, prompt=None,
                            messages=None, prefix_group=None, prefix_tokens=0)
            for t in (0.0, 1.0, 2.0, 3.0, 4.0)]
    share, positions, per_layout, offset = services._trace_share(
        rows, 1, 2, speed=2.0, horizon_s=4.0)  # type: ignore[arg-type]
    assert per_layout % 5 == 0 and per_layout >= 10
    assert positions[:4] == [1, 3, 6, 8]  # second pass: positions 5..9, shard 1 gets 6, 8
    assert [r.arrival_s for r in share[:4]] == [1.0, 3.0, 6.0, 8.0]  # period 5 s
    assert offset == pytest.approx(0.5)  # its first request is due 1 s / 2 after the start


@pytest.mark.parametrize(("speeds", "why"), [
    ([], "empty"), ([1, -2], "negative"), ([0], "zero"), (["fast"], "not a number"),
    ([True], "a boolean"), ([2000], "too fast"), (None, "missing"),
])
def test_bad_trace_speeds_are_refused_naming_the_field(db, bench_pools, trace, system,
                                                        speeds, why):
    with pytest.raises(ValidationError) as refused:
        services.run_create(actor=system, trace=trace, pools=[bench_pools["paced"]],
                            model_id=MODEL, timing="trace", speeds=speeds, **SLO)
    assert "speeds" in refused.value.message_dict, why
    assert not Run.objects.exists()


def test_speeds_without_trace_timing_and_unknown_timings_are_refused(db, bench_pools, trace,
                                                                     system):
    with pytest.raises(ValidationError) as refused:
        services.run_create(actor=system, trace=trace, pools=[bench_pools["paced"]],
                            model_id=MODEL, speeds=[1.0], **SLO)
    assert "speeds" in refused.value.message_dict
    with pytest.raises(ValidationError) as unknown:
        services.run_create(actor=system, trace=trace, pools=[bench_pools["paced"]],
                            model_id=MODEL, timing="poisson", speeds=[1.0], **SLO)
    assert "timing" in unknown.value.message_dict
    assert not Run.objects.exists()


def test_trace_timing_evidence_is_not_a_concurrency_sweep_for_the_gate(world):  # noqa: F811
    from fleetctl.accounts.actor import Actor
    from migrations_plan import evidence as ev
    from migrations_plan import services as plans
    from migrations_plan.models import Plan

    plan = world.plan(cost_margin_pct=10)
    plans.evidence_record(
        actor=Actor.for_system("benchmark"), pool=world.candidate, kind="benchmark",
        verdict="pass", summary="highest SLO-passing trace speed 4×",
        data={"run": 1, "timing": "trace", "best_concurrency": None, "best_speed": 4.0,
              "output_tokens_per_s": 1000.0, "cost_per_1m": "5.00", "binding": "tpot_p95",
              "slo": {"ttft_p95_ms": 800, "tpot_p95_ms": 60, "error_rate": 0.01}})
    plan = Plan.objects.get(pk=plan.pk)
    outcome = next(o for o in ev.evaluate_gate(plan, stage=2).outcomes
                   if o.check.key == "benchmark-slo")
    assert outcome.status == ev.INSUFFICIENT
    assert "measured at trace timing; the rule needs a concurrency sweep" in \
        outcome.result.summary
