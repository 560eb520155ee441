"""Eval runs end to end, all real: simulated pools whose task accuracy is known (the simulator
answers each bundled item right iff a unit draw keyed by (model, prompt, seed) falls below the
profile's `task_accuracy`, so a 0.87 pool is wrong on a superset of the items a 0.92 pool gets
wrong), the bundled `fleetctl-core` suite (1,200 items), the session's Celery worker running
`evals.run`, the statistics, the evidence and the plan's gate.

Why these numbers give the same outcome every time. The simulator's answers are a function of
the prompt, so a run's scores are the same on every run of the suite; what the statistics
decide is fixed once the draws are. The arithmetic below says that draw lands on the asserted
side with overwhelming probability, so the test is not a coin that happens to land right:

- accuracy: a pool of true accuracy p scored on n = 1,200 items lands inside its 99 % Wilson
  interval with probability 0.99 (checked at 99 %, while the run reports 95 %).
- the 5-point regression (candidate 0.87, primary 0.92, divergence 0, so every discordant item
  is one the primary gets right and the candidate wrong): the paired difference d has mean
  -0.05 and sd sqrt((0.05 - 0.05²) / 1200) ≈ 0.0063. The verdict is fail when the 95 % upper
  bound, ≈ d + 1.96 × 0.0063 = d + 0.0123, is below -0.02, i.e. whenever d < -0.032: that is
  2.8 sd from the mean, P ≈ 0.997. (With 300 items the same sd is 0.0126 and P(fail) ≈ 0.73:
  hence the 1,200-item suite.)
- A/A: two pools of one profile answer every item alike, so d = 0 exactly and the interval
  sits inside ±margin; a pass, every time. Both carry replica noise (1.5 %, the built-in
  MI300X's), which the simulator applies to free text only, never to a scripted task answer
  or a seeded request: d stays 0 with it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from django.contrib.auth.models import User

from fleetctl.accounts.actor import Actor
from fleetctl.evals import bundled, services
from fleetctl.evals.models import EvalResult, EvalRun, EvalSuite
from fleetctl.fleet.models import Pool, Region
from fleetctl.fleet.services import pool_create, pool_health_record, pool_model_create
from fleetctl.inference.confidence import wilson_interval
from fleetctl.traffic.services import gateway_create, route_create
from migrations_plan import evidence as ev
from migrations_plan import services as plans
from migrations_plan.models import Evidence, Plan
from tests.conftest import SYSTEM
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow

MODEL = "llama-3.1-8b-instruct"
ACCURACY = {"prim": 0.92, "twin": 0.92, "low": 0.87}
# Every pool carries the built-in profiles' replica noise (GPU batch nondeterminism), so the
# A/A twins are twins with noise, as issue 27 asks. The simulator never flips a scripted task
# answer, nor a request that names a seed (an eval's decoding does): noise cannot reach an
# eval's scores, and the A/A difference is still exactly 0 — which the A/A test checks.
SIM_POOLS = {name: f"quick:task_accuracy={accuracy},replica_noise=0.015"
             for name, accuracy in ACCURACY.items()}
FAMILIES = set(bundled.FAMILIES)


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("evals-e2e"), TEST_PROFILES, SIM_POOLS)
    yield sim
    sim.stop()


@dataclass
class World:
    plan: Plan
    suite: EvalSuite
    lead: Actor
    pools: dict[str, Pool]  # sim pool name -> registry pool


@pytest.fixture
def world(celery_worker: Any, sims: SimProcess, region: Region,
          make_user: Callable[..., User]) -> Callable[[str], World]:
    """`build(candidate)`: registry pools on the simulated ones, the bundled suite, and a plan
    (candidate vs the 0.92 primary, quality margin 2 points) moved to stage 2 as the demo
    does: opened by one lead, approved by another."""
    lead = Actor(user=make_user("lead", "platform-lead"))
    lead2 = Actor(user=make_user("lead2", "platform-lead"))
    [suite] = services.suite_install_bundled(actor=SYSTEM, names=[bundled.MIX])

    def build(candidate: str) -> World:
        pools = {}
        for name in ("prim", candidate):
            pool = pool_create(actor=SYSTEM, name=f"{name}-e2e", runtime="cuda",
                               accelerator="H200", region=region, base_urls=[sims.url(name)],
                               max_context_tokens=32768, node_hourly_rate="30")
            pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
            pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
            pools[name] = pool
        route = route_create(actor=SYSTEM, name="llama", model_id=MODEL,
                             primary_pool=pools["prim"], reason="test")
        # A gateway carries the route (stage 1's "only through a route"); none is reached.
        gateway_create(actor=SYSTEM, name="envoy-e2e", kind="envoy",
                       admin_address="http://127.0.0.1:1", options={"config_dir": "/tmp/x"},
                       routes=[route])
        plan = plans.plan_create(actor=lead, name="evals-e2e", candidate_pool=pools[candidate],
                                 primary_pool=pools["prim"], routes=[route],
                                 slo_ttft_p95_ms=800, slo_tpot_p95_ms=60, slo_error_rate=0.01,
                                 quality_margin_pct=2)
        plans.approve(actor=lead2, plan=plan, justification="the eval tests start at stage 2")
        plan = plans.advance(actor=lead2, plan=plan, reason="stage 1 signed off")
        assert plan.stage == 2
        return World(plan=plan, suite=suite, lead=lead, pools=pools)

    return build


def run_to_the_end(w: World, **options: Any) -> EvalRun:
    run = services.run_create(actor=w.lead, suite=w.suite, plan=w.plan, concurrency=32,
                              **options)
    assert run.total == 2 * w.suite.item_count == 2400
    wait_until(lambda: not EvalRun.objects.get(pk=run.pk).active, timeout_s=600,
               every_s=0.5, what=f"{run} to finish")
    run = EvalRun.objects.get(pk=run.pk)
    assert (run.status, run.error) == ("complete", "")
    return run


def check(plan: Plan, stage: int, key: str) -> str:
    outcome = next(o for o in ev.evaluate_gate(plan, stage=stage).outcomes
                   if o.check.key == key)
    return str(outcome.status)


def assert_every_row_scored_once(run: EvalRun) -> None:
    rows = EvalResult.objects.filter(run=run)
    assert rows.count() == run.total == run.done
    assert not rows.exclude(status="done").exists()
    assert not rows.filter(score__isnull=True).exists()
    for attempts in rows.values_list("attempts", flat=True):
        assert [a for a in attempts if not a.get("error")], attempts  # one answered attempt
        assert len([a for a in attempts if not a.get("error")]) == 1, attempts


def assert_accuracy_measured(run: EvalRun, pool: Pool, accuracy: float) -> None:
    """The pool's measured accuracy: the row count and the run's figure agree, and the
    profile's accuracy lies inside the Wilson interval around it (99 %: the 1 % of draws
    outside it would fail this test every time, see the module docstring)."""
    scores = list(EvalResult.objects.filter(run=run, run_pool__pool=pool)
                  .values_list("score", flat=True))
    assert len(scores) == 1200 and set(scores) <= {0.0, 1.0}
    right = int(sum(s for s in scores if s is not None))
    reported = run.stats["pools"][pool.name]
    assert reported["n"] == 1200 and reported["method"].lower().startswith("wilson")
    assert reported["score"] == pytest.approx(right / 1200)
    assert reported["lower"] <= right / 1200 <= reported["upper"]
    wide = wilson_interval(right, 1200, 0.99)
    assert wide.lower <= accuracy <= wide.upper, (pool.name, right / 1200, wide)


def test_a_candidate_five_points_worse_fails_with_its_evidence_on_the_stage_2_check(world):
    w = world("low")
    assert check(w.plan, 2, "eval") == ev.INSUFFICIENT  # nothing measured yet
    run = run_to_the_end(w)
    assert run.plan_stage == 2 and run.margin == pytest.approx(0.02)
    assert_every_row_scored_once(run)
    for name in ("prim", "low"):
        assert_accuracy_measured(run, w.pools[name], ACCURACY[name])

    paired = run.stats["paired"]
    assert paired["n"] == 1200
    assert paired["estimate"] == pytest.approx(-0.05, abs=0.02)
    assert paired["upper"] < -0.02  # the whole interval beyond the margin
    # Divergence 0: the 0.87 pool is wrong on a superset of the items the 0.92 pool misses.
    assert paired["candidate_only"] == paired["primary_only"] == 0
    assert (run.verdict, paired["verdict"]) == ("fail", "fail")
    assert set(run.stats["tags"]) >= FAMILIES

    evidence = Evidence.objects.get(id=run.evidence_id or 0)
    assert (evidence.kind, evidence.verdict, evidence.pool_id) == ("eval", "fail",
                                                                   w.pools["low"].pk)
    assert evidence.source == f"eval run {run.pk}"
    assert evidence.data["run"] == run.pk
    assert (evidence.data["suite"], evidence.data["suite_sha256"]) == (bundled.MIX,
                                                                      w.suite.sha256)
    assert set(evidence.data["fingerprints"]) == {"prim-e2e", "low-e2e"}
    assert run.live_evidence_id is None
    assert check(w.plan, 2, "eval") == ev.FAIL


def test_an_a_a_run_passes_and_does_not_satisfy_the_stage_4_quality_check(world):
    w = world("twin")
    run = run_to_the_end(w)
    assert_every_row_scored_once(run)
    for name in ("prim", "twin"):
        assert_accuracy_measured(run, w.pools[name], ACCURACY[name])
    paired = run.stats["paired"]
    assert paired["n"] == 1200 and paired["estimate"] == 0
    assert paired["lower"] >= -0.02
    assert run.verdict == "pass"

    assert Evidence.objects.get(id=run.evidence_id or 0).verdict == "pass"
    assert check(w.plan, 2, "eval") == ev.PASS
    # Stage 4's "quality unchanged" reads live-quality, which only a stage-4 eval (or shadow
    # pairs of stage-4 live traffic) writes: this stage-2 run leaves it waiting.
    assert run.live_evidence_id is None
    assert not Evidence.objects.filter(kind="live-quality").exists()
    assert check(w.plan, 4, "quality") == ev.INSUFFICIENT
