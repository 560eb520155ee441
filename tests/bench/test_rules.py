"""The benchmark evidence rules a plan's gate uses: SLO met at a useful concurrency, and cost
per 1M within the plan's margin of the primary's (test_cost_rules.py: like with like,
currencies, stale costs, the latency margin)."""

from __future__ import annotations

from fleetctl.accounts.actor import Actor
from fleetctl.fleet.services import pool_update
from migrations_plan import evidence as ev
from migrations_plan import services as plans
from migrations_plan.models import Plan
from tests.migrations_plan.conftest import world  # noqa: F401

BOT = Actor.for_system("benchmark")


def _bench(pool, *, best, cost, ttft=800.0, verdict="pass"):
    return plans.evidence_record(
        actor=BOT, pool=pool, kind="benchmark", verdict=verdict, summary=f"best {best}",
        data={"run": 1, "best_concurrency": best, "output_tokens_per_s": 1000.0,
              "cost_per_1m": cost, "binding": "tpot_p95",
              "slo": {"ttft_p95_ms": ttft, "tpot_p95_ms": 60, "error_rate": 0.01}})


def _status(plan, key):
    plan = Plan.objects.get(pk=plan.pk)
    outcome = next(o for o in ev.evaluate_gate(plan, stage=2).outcomes if o.check.key == key)
    return outcome.status, outcome.result.summary


def test_meets_the_slo_at_a_useful_concurrency(world):  # noqa: F811
    plan = world.plan(cost_margin_pct=10)
    assert _status(plan, "benchmark-slo")[0] == ev.INSUFFICIENT
    _bench(world.candidate, best=4, cost="5.00")
    assert _status(plan, "benchmark-slo") == (
        ev.FAIL, "Meets the SLO up to concurrency 4, below the 8 required.")
    _bench(world.candidate, best=16, cost="5.00", ttft=2000)  # run with a looser SLO
    status, summary = _status(plan, "benchmark-slo")
    assert status == ev.INSUFFICIENT and "looser than the plan's on ttft_p95_ms" in summary
    _bench(world.candidate, best=16, cost="5.00")
    assert _status(plan, "benchmark-slo")[0] == ev.PASS
    # A new runtime on the candidate: the benchmark no longer describes it.
    pool_update(actor=BOT, pool=world.candidate, runtime_version="rocm-7.0")
    status, summary = _status(plan, "benchmark-slo")
    assert status == ev.INSUFFICIENT and "runtime version changed" in summary


def test_cost_within_the_margin_of_the_primary(world):  # noqa: F811
    plan = world.plan(cost_margin_pct=10)
    _bench(world.candidate, best=16, cost="5.40")
    assert _status(plan, "cost-vs-primary")[1] == (
        "No benchmark of h200-us yet: run one (Benchmarks → New run).")
    _bench(world.primary, best=32, cost="5.00")
    assert _status(plan, "cost-vs-primary")[0] == ev.PASS  # 5.40 ≤ 5.00 × 1.10
    _bench(world.candidate, best=16, cost="5.60")
    status, summary = _status(plan, "cost-vs-primary")
    assert status == ev.FAIL and "over h200-us's 5.00 USD + 10 % (both measured in run #1)" \
        in summary


def _at(row, when):
    from migrations_plan.models import Evidence

    Evidence.objects.filter(pk=row.pk).update(observed_at=when)
    return row


def test_a_benchmark_counts_as_repeated_only_on_another_day_with_the_same_figures(
        world):  # noqa: F811
    """benchmark.repeated: the newest run and one ≥ 24 h before it, measured alike, agree on
    the level and within 10 % on throughput. Times are set on the rows: no waiting a day."""
    from datetime import timedelta

    from django.utils import timezone

    from fleetctl.bench.evidence import repeated

    plan = world.plan()
    now = timezone.now()
    params = {"min_gap_hours": 24.0, "tolerance_pct": 10.0, "within_days": 30.0}

    def judge():
        ctx = ev.RuleContext(plan=Plan.objects.get(pk=plan.pk), candidate=world.candidate,
                             primary=world.primary, routes=list(plan.routes.all()), now=now)
        return repeated(ctx, params)

    assert judge().status == ev.INSUFFICIENT
    _at(_bench(world.candidate, best=16, cost="5.00"), now - timedelta(hours=30))
    _at(_bench(world.candidate, best=16, cost="5.00"), now - timedelta(hours=20))
    result = judge()  # 10 h apart: the same day, as far as the rule goes
    assert result.status == ev.INSUFFICIENT and "at least 24 h later" in result.summary
    # 26 h after the first: the same level, the same throughput.
    _at(_bench(world.candidate, best=16, cost="5.00"), now - timedelta(hours=4))
    result = judge()
    assert result.status == ev.PASS, result.summary
    assert "26.0 h apart" in result.summary and result.numbers["spread_pct"] == 0
    # A newer run on a looser SLO is not a repeat of the others: nothing to compare it with.
    _at(_bench(world.candidate, best=16, cost="5.00", ttft=2000), now - timedelta(hours=1))
    assert judge().status == ev.INSUFFICIENT
    # The same measurement, a lower level: the repeat disagrees.
    _at(_bench(world.candidate, best=8, cost="5.00"), now)
    result = judge()
    assert result.status == ev.FAIL and "was 16 then 8" in result.summary, result.summary
