"""The demo's eval runs, for real: the simulated fleet `make demo` starts (its built-in
profiles: the H200 and the MI300X answer the bundled tasks right 92 % of the time, the A100's
legacy stack less often), the seed with --evals as `make demo` runs it, and the session's
worker on the evals queue. The MI300X plan's stage-2 eval check reads a measured pass; the A100
plan's a measured fail. A second seed queues nothing more."""

from __future__ import annotations

import io
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command

from fleetctl.evals import bundled
from fleetctl.evals.models import EvalResult, EvalRun, EvalSuite
from migrations_plan import evidence as ev
from migrations_plan.models import Evidence, Plan
from tests.sim import simproc
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def demo_fleet(tmp_path: Path) -> Iterator[int]:
    with simproc.demo_fleet(tmp_path / "sim.log") as base:
        yield base


def seed(base: int) -> str:
    """The seed with the options `make demo` gives it (but no Envoy and no probes); what it
    created."""
    out = io.StringIO()
    call_command("demo_seed", "--password=demo-pw", "--sim-base-port", str(base),
                 "--gateway-admin", "http://127.0.0.1:1",
                 "--gateway-config-dir", "/tmp/fleetctl-demo-test", "--evals",
                 stdout=out, stderr=io.StringIO())
    return out.getvalue()


def eval_check(plan: Plan) -> str:
    return str(next(o for o in ev.evaluate_gate(plan, stage=2).outcomes
                    if o.check.key == "eval").status)


def test_the_demo_evaluates_both_plans_candidates_the_mi300x_passes_and_the_a100_fails(
        celery_worker, demo_fleet):
    assert "eval run of mi300x-llama-8b" in seed(demo_fleet)
    assert set(EvalSuite.objects.values_list("name", flat=True)) == set(bundled.SUITES)
    runs = {run.plan.name: run for run in EvalRun.objects.select_related("plan")
            if run.plan is not None}
    assert set(runs) == {"mi300x-llama-8b", "a100-llama-8b"}
    mi300x_plan = Plan.objects.get(name="mi300x-llama-8b")
    assert eval_check(mi300x_plan) == ev.INSUFFICIENT  # nothing measured yet

    wait_until(lambda: not EvalRun.objects.filter(status__in=EvalRun.ACTIVE).exists(),
               timeout_s=900, every_s=1, what="the demo's eval runs")
    for name, run in runs.items():
        run = EvalRun.objects.get(pk=run.pk)
        runs[name] = run
        assert (run.status, run.error) == ("complete", ""), name
        assert run.suite.name == bundled.MIX and run.done == run.total == 2400, name
        assert run.created_by == "lead"
        assert not EvalResult.objects.filter(run=run, score__isnull=True).exists(), name

    mi300x, a100 = runs["mi300x-llama-8b"], runs["a100-llama-8b"]
    assert [p.pool.name for p in mi300x.run_pools.order_by("position")] == [
        "mi300x-us-east", "h200-us-east"]
    assert mi300x.plan_stage == 2 and a100.plan_stage == 3
    assert mi300x.verdict == "pass", mi300x.summary
    assert a100.verdict == "fail", a100.summary
    assert a100.stats["paired"]["upper"] < -a100.margin

    assert Evidence.objects.get(id=mi300x.evidence_id or 0).pool.name == "mi300x-us-east"
    assert eval_check(mi300x_plan) == ev.PASS
    assert eval_check(Plan.objects.get(name="a100-llama-8b")) == ev.FAIL

    # Every start seeds again: the plans keep their runs, none is queued twice.
    assert "eval run" not in seed(demo_fleet)
    assert EvalRun.objects.count() == 2
