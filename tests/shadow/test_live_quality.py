"""A shadow run judged while its plan is in stage 4 mirrors live traffic, so its judgement also
feeds stage 4's "Quality unchanged" check: the judge records `live-quality` evidence beside the
`shadow` row (same verdict and summary, the gated metrics in its data). In any other stage it
records `shadow` only, and the stage-4 check stays without evidence."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from fleetctl.shadow import live, services, stats
from fleetctl.shadow.models import ShadowRun
from migrations_plan import evidence as ev
from migrations_plan.models import Evidence, Plan
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture
from tests.shadow import forget_shadow_keys
from tests.shadow.test_api import _pair

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _clean_redis() -> Iterator[None]:
    """A run publishes its route to Redis; the test database rolls back, Redis does not."""
    yield
    forget_shadow_keys(live.client())


def judged_run(w: World, stage: int, capture, *, diverged: bool) -> ShadowRun:
    """A running shadow run of the plan with 12 stored pairs, judged while the plan is in
    `stage`."""
    plan = w.plan()
    with capture(execute=True):
        run = services.run_create(actor=w.actor("lead"), plan=plan, min_pairs=10)
    for n in range(12):
        _pair(run, n, diverged=diverged)
    Plan.objects.filter(pk=plan.pk).update(stage=stage)
    services.run_judge(run=run)
    run.refresh_from_db()
    return run


def quality_check(plan: Plan) -> ev.CheckOutcome:
    gate = ev.evaluate_gate(Plan.objects.get(pk=plan.pk), stage=4)
    return next(o for o in gate.outcomes if o.check.key == "quality")


def test_in_stage_4_the_judge_records_live_quality_beside_shadow(
        world: World, django_capture_on_commit_callbacks):  # noqa: F811
    run = judged_run(world, 4, django_capture_on_commit_callbacks, diverged=True)
    assert run.verdict == "fail"
    shadow = Evidence.objects.get(kind="shadow")
    live_row = Evidence.objects.get(kind="live-quality")
    assert shadow.pk == run.evidence_id
    assert (live_row.pool, live_row.verdict, live_row.summary) == (
        world.candidate, "fail", shadow.summary)
    assert (live_row.source, live_row.url, live_row.model_id, live_row.route) == (
        f"shadow run {run.pk}", f"/shadow/runs/{run.pk}/", run.model_id, run.route)
    data = live_row.data
    assert (data["source"], data["run"], data["stage"], data["items"]) == (
        "shadow", run.pk, 4, 12)
    assert (data["candidate"], data["primary"]) == ("mi300x-us", "h200-us")
    assert sorted(data["metrics"]) == sorted(stats.GATED)
    assert data["metrics"]["divergence"] == shadow.data["metrics"]["divergence"]
    assert data["fingerprints"] == shadow.data["fingerprints"]
    # Stage 4's check reads it, measured by the shadow run.
    check = quality_check(run.plan)
    assert check.status == ev.FAIL
    assert check.result.evidence[0].source == f"shadow run {run.pk}"
    # Judged again with nothing new: neither kind is recorded again.
    services.run_judge(run=run)
    assert Evidence.objects.filter(kind__in=["shadow", "live-quality"]).count() == 2


def test_in_stage_2_the_judge_records_shadow_only(
        world: World, django_capture_on_commit_callbacks):  # noqa: F811
    run = judged_run(world, 2, django_capture_on_commit_callbacks, diverged=False)
    assert list(Evidence.objects.values_list("kind", "verdict")) == [("shadow", "warn")]
    assert run.evidence_id == Evidence.objects.get().pk
    # Stage 4's check has nothing to read: a stage-2 shadow run does not speak to it.
    assert quality_check(run.plan).status == ev.INSUFFICIENT
