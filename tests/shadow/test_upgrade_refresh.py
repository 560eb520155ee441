"""A pool of a running shadow run that changes (it reports an upgrade, or a registry edit
changes its fingerprint) gets its run judged at once by fleet's report and change hooks: the
`shadow` evidence is recorded on the new fingerprints then, not at the next refresh up to
EVIDENCE_EVERY_S later, so the stage-2 divergence check does not sit on an expired row. The
judgement restarts then: only the pairs received after the change count (the earlier ones were
measured on what the pool was), so the check says how many came since and stays insufficient
until there are enough. Real services, hooks and database; pairs stored as the worker stores
them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import pool_health_record, pool_update
from fleetctl.shadow import live, services, stats
from fleetctl.shadow.models import ShadowPair, ShadowRun
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


def reports(pool: Pool, server_version: str) -> None:
    """One health probe of the pool that reads this server version (fleet's own service)."""
    pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=5.0,
                       reported={"server_version": server_version})


def judged_run(w: World, capture) -> ShadowRun:
    """A running shadow run with 12 stored pairs, judged once (its first evidence row), then
    2 more pairs: within EVIDENCE_EVERY_S, judged again it records nothing new."""
    with capture(execute=True):
        run = services.run_create(actor=w.actor("lead"), plan=w.plan(), min_pairs=10)
    for n in range(12):
        _pair(run, n)
    services.run_judge(run=run)
    first = ShadowRun.objects.get(pk=run.pk).evidence_id
    for n in (12, 13):
        _pair(run, n)
    services.run_judge(run=run)
    assert first is not None and ShadowRun.objects.get(pk=run.pk).evidence_id == first
    return ShadowRun.objects.get(pk=run.pk)


def divergence(plan: Plan) -> ev.CheckOutcome:
    gate = ev.evaluate_gate(Plan.objects.get(pk=plan.pk), stage=2)
    return next(o for o in gate.outcomes if o.check.key == "divergence")


def test_an_upgrade_the_candidate_reports_is_judged_at_once(
        world: World, django_capture_on_commit_callbacks):  # noqa: F811
    reports(world.candidate, "0.6.0")  # a first report: recorded, not a change
    run = judged_run(world, django_capture_on_commit_callbacks)
    before = Evidence.objects.get(pk=run.evidence_id)
    assert before.pool_fingerprint["server_version"] == "0.6.0"
    assert divergence(run.plan).result.evidence[0].ref == f"evidence:{before.pk}"

    with django_capture_on_commit_callbacks(execute=True):
        reports(world.candidate, "0.7.0")
    run.refresh_from_db()
    after = Evidence.objects.get(pk=run.evidence_id)
    assert after.pk != before.pk
    assert after.pool_fingerprint["server_version"] == "0.7.0"
    assert after.data["fingerprints"]["candidate"]["server_version"] == "0.7.0"
    # None of the 14 pairs measured on 0.6.0 is evidence about 0.7.0: the row judges none.
    assert after.data["pairs"] == 0 and after.verdict == "info"
    assert run.judged_since is not None and after.data["since"] == run.judged_since.isoformat()
    changed = f"{world.candidate.name} changed to server version 0.7.0"
    assert run.judged_since_why == changed
    # The gate reads the new row, not an expired one, and says what it waits for.
    outcome = divergence(run.plan)
    assert outcome.result.evidence[0].ref == f"evidence:{after.pk}"
    assert outcome.status == ev.INSUFFICIENT
    assert outcome.result.summary.startswith(f"0 pairs since {changed} at "), \
        outcome.result.summary
    assert "; needs 10." in outcome.result.summary

    # Another upgrade with no pair since: the judgement restarts again, on 0.8.0.
    with django_capture_on_commit_callbacks(execute=True):
        reports(world.candidate, "0.8.0")
    run.refresh_from_db()
    newer = Evidence.objects.get(pk=run.evidence_id)
    assert newer.pk != after.pk and newer.data["pairs"] == 0
    assert run.judged_since_why == f"{world.candidate.name} changed to server version 0.8.0"
    outcome = divergence(run.plan)
    assert outcome.status == ev.INSUFFICIENT, outcome.result.summary
    assert "changed to server version 0.8.0" in outcome.result.summary


def test_a_registry_edit_of_the_primary_is_judged_at_once(
        world: World, django_capture_on_commit_callbacks):  # noqa: F811
    run = judged_run(world, django_capture_on_commit_callbacks)
    before = Evidence.objects.get(pk=run.evidence_id)
    with django_capture_on_commit_callbacks(execute=True):
        pool_update(actor=Actor.for_system("registry"), pool=world.primary,
                    runtime_version="cuda-12.8")
    run.refresh_from_db()
    after = Evidence.objects.get(pk=run.evidence_id)
    assert after.pk != before.pk
    assert after.data["fingerprints"]["primary"]["runtime_version"] == "cuda-12.8"
    assert before.data["fingerprints"]["primary"]["runtime_version"] != "cuda-12.8"
    assert after.data["fingerprints"]["candidate"] == before.data["fingerprints"]["candidate"]
    # The primary is half of every pair: a change of it restarts the judgement too.
    assert after.data["pairs"] == 0 and after.verdict == "info"
    assert run.judged_since_why == f"{world.primary.name} changed to runtime version cuda-12.8"


def age(run: ShadowRun) -> None:
    """The run's last row as if recorded EVIDENCE_EVERY_S ago: a refresh is due with pairs."""
    Evidence.objects.filter(pk=ShadowRun.objects.get(pk=run.pk).evidence_id).update(
        observed_at=timezone.now() - timedelta(seconds=services.EVIDENCE_EVERY_S + 1))


def pair_now(run: ShadowRun, n: int, *, diverged: bool = False) -> ShadowPair:
    """A pair received now (test_api's `_pair` dates pair n at 100 - n seconds ago)."""
    pair = _pair(run, n, diverged=diverged)
    ShadowPair.objects.filter(pk=pair.pk).update(received_at=timezone.now())
    return pair


def test_after_an_upgrade_only_the_pairs_received_since_count(
        world: World, client_for, django_capture_on_commit_callbacks):  # noqa: F811
    """0.6.0 diverged on every pair; 0.7.0 on none. After the upgrade the verdict is 0.7.0's,
    from 0.7.0's pairs alone: insufficient until min_pairs of them, then what those pairs say
    — never the pooled 0.6.0 + 0.7.0 sample. The 0.6.0 pairs stay listed and exportable."""
    reports(world.candidate, "0.6.0")
    with django_capture_on_commit_callbacks(execute=True):
        run = services.run_create(actor=world.actor("lead"), plan=world.plan(), min_pairs=10)
    for n in range(14):
        _pair(run, n, diverged=True)
    services.run_judge(run=run)
    run.refresh_from_db()
    assert run.verdict == "fail", run.summary
    assert run.judged_since is None and divergence(run.plan).status == ev.FAIL

    with django_capture_on_commit_callbacks(execute=True):
        reports(world.candidate, "0.7.0")
    run.refresh_from_db()
    upgraded_at = run.judged_since
    assert isinstance(upgraded_at, datetime)
    changed = f"{world.candidate.name} changed to server version 0.7.0"

    # 9 pairs on 0.7.0: 23 pairs in all, more than min_pairs, but 9 of what it is now. The
    # restart's row is refreshed as any row is: EVIDENCE_EVERY_S later (aged here).
    for n in range(100, 109):
        pair_now(run, n)
    age(run)
    services.run_judge(run=run)
    run.refresh_from_db()
    row = Evidence.objects.get(pk=run.evidence_id)
    assert run.verdict == "insufficient", run.summary
    assert row.data["pairs"] == 9 and row.verdict == "info"
    assert datetime.fromisoformat(row.data["window"]["from"]) > upgraded_at
    outcome = divergence(run.plan)
    assert outcome.status == ev.INSUFFICIENT
    assert outcome.result.summary.startswith(
        f"9 pairs since {changed} at {upgraded_at:%Y-%m-%d %H:%M:%S} UTC; needs 10."), \
        outcome.result.summary

    # The 10th: judged on the ten 0.7.0 pairs exactly, as a run started on 0.7.0 would be.
    pair_now(run, 109)
    services.run_judge(run=run)
    run.refresh_from_db()
    row = Evidence.objects.get(pk=run.evidence_id)
    new = list(ShadowPair.objects.filter(run=run, received_at__gt=upgraded_at)
               .order_by("id").values_list("noise", "signal"))
    alone = stats.judge_pairs(new, margin=run.margin, min_pairs=10,
                              confidence=run.confidence)
    assert len(new) == 10 and alone.verdict != "insufficient"
    assert run.verdict == alone.verdict != "fail" and row.data["pairs"] == 10
    assert row.data["metrics"] == alone.metrics_dict()
    assert row.summary.startswith(f"Since {changed} at ")
    assert divergence(run.plan).result.evidence[0].ref == f"evidence:{row.pk}"
    assert run.judgements.order_by("-at", "-id").first().pairs == 10

    # History: the 0.6.0 pairs are kept, exported, and the page says what is judged.
    viewer = client_for("viewer")
    export = viewer.get(f"/api/v1/shadow-runs/{run.pk}/export/?format=json")
    assert export.status_code == 200
    assert len(json.loads(b"".join(export.streaming_content))["pairs"]) == 24
    page = viewer.get(f"/shadow/runs/{run.pk}/").content.decode()
    assert f"Judged since {upgraded_at:%Y-%m-%d %H:%M:%S} UTC ({changed})" in page
