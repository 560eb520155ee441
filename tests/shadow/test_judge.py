"""The judge on pairs a real worker made from real simulated pools: a candidate answering as
the primary does passes (A/A), one that diverges fails, too few pairs are insufficient data,
and each judgement lands as a time-series row and as `shadow` evidence about the candidate
(the stage-2 check's input), recorded again only when the verdict changes or
EVIDENCE_EVERY_S passed with new pairs. The run is judged on the first pair of each distinct
request, in order: a request asked again adds nothing."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from fleetctl.shadow import services
from fleetctl.shadow.models import ShadowJudgement, ShadowPair, ShadowRun
from migrations_plan.models import Evidence
from tests.migrations_plan.conftest import World, world  # noqa: F401 - the fixture
from tests.shadow.test_pair import (  # noqa: F401 - fixtures
    _clean_redis,
    chat,
    point,
    send_pairs,
    shadow_sim,
    shadow_world,
)
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


def paired(run: ShadowRun, n: int, *, offset: int = 0, max_tokens: int = 24) -> None:
    send_pairs(run, [chat(offset + i, max_tokens=max_tokens) for i in range(n)])
    wait_until(lambda: ShadowPair.objects.filter(run=run).count() >= offset + n,
               timeout_s=120, what=f"{offset + n} pairs")


def start(w: World, **kwargs) -> ShadowRun:
    return services.run_create(actor=w.actor("lead"), plan=w.plan(), content="off", **kwargs)


def test_a_candidate_answering_as_the_primary_passes_at_min_pairs(
        celery_worker, shadow_world: World):  # noqa: F811
    run = start(shadow_world, min_pairs=200)
    paired(run, 120)
    early = services.run_judge(run=run)
    assert early.verdict == "insufficient" and early.pairs == 120
    paired(run, 80, offset=120)
    judgement = services.run_judge(run=run)
    assert judgement.verdict == "pass", judgement.metrics
    div = judgement.metrics["divergence"]
    assert (div["n"], div["noise_rate"], div["signal_rate"], div["estimate"]) == (200, 0, 0, 0)
    assert div["upper"] <= 0.02 and div["method"] == "confidence-sequence"
    run.refresh_from_db()
    assert run.verdict == "pass"
    assert run.summary == ("divergence +0.0 pts [\u22121.5, +1.5] vs noise floor 0.0 % over "
                           "200 pairs: pass (margin 2 pts)")
    evidence = Evidence.objects.get(pk=run.evidence_id)
    assert (evidence.kind, evidence.verdict, evidence.pool) == ("shadow", "pass",
                                                               shadow_world.candidate)
    assert evidence.summary == run.summary and evidence.url == f"/shadow/runs/{run.pk}/"
    assert evidence.data["pairs"] == 200 and evidence.data["gated"][0] == "divergence"
    assert set(evidence.data["fingerprints"]) == {"primary", "candidate"}
    assert evidence.data["counters"]["pairs"] == 200
    assert list(ShadowJudgement.objects.filter(run=run).values_list("verdict", flat=True)) == [
        "insufficient", "pass"]
    # The same requests again add nothing: the run is judged on each distinct request once.
    send_pairs(run, [chat(i, max_tokens=24) for i in range(30)])
    wait_until(lambda: ShadowPair.objects.filter(run=run).count() >= 230, timeout_s=120,
               what="230 pairs")
    again = services.run_judge(run=run)
    assert (again.pairs, again.verdict) == (200, "pass")


def test_a_diverging_candidate_fails_and_too_few_pairs_are_insufficient(
        celery_worker, shadow_world: World, shadow_sim):  # noqa: F811
    shadow_world.candidate = point(shadow_world.candidate, shadow_sim.url("regressed"))
    run = start(shadow_world, min_pairs=30)
    paired(run, 20, max_tokens=48)
    few = services.run_judge(run=run)
    assert few.verdict == "insufficient"
    assert few.metrics["divergence"]["signal_rate"] > 0.2  # it diverges, but 20 < 30
    first_evidence = ShadowRun.objects.get(pk=run.pk).evidence_id
    assert Evidence.objects.get(pk=first_evidence).verdict == "info"

    paired(run, 20, offset=20, max_tokens=48)
    judgement = services.run_judge(run=run)
    assert judgement.verdict == "fail", judgement.metrics
    div = judgement.metrics["divergence"]
    assert div["verdict"] == "fail" and div["lower"] > 0.02 and div["noise_rate"] == 0
    run.refresh_from_db()
    assert run.verdict == "fail" and ": fail (margin 2 pts)" in run.summary, run.summary
    assert run.evidence_id != first_evidence  # the verdict changed: recorded at once
    assert Evidence.objects.get(pk=run.evidence_id).verdict == "fail"

    # Same verdict, no new pairs: no new evidence; EVIDENCE_EVERY_S later with new pairs:
    # one more (the same judgement with more pairs, to which an approval stays bound).
    services.run_judge(run=run)
    assert ShadowRun.objects.get(pk=run.pk).evidence_id == run.evidence_id
    Evidence.objects.filter(pk=run.evidence_id).update(
        observed_at=timezone.now() - timedelta(seconds=services.EVIDENCE_EVERY_S + 1))
    services.run_judge(run=run)
    assert ShadowRun.objects.get(pk=run.pk).evidence_id == run.evidence_id
    paired(run, 2, offset=40, max_tokens=48)
    services.run_judge(run=run)
    assert ShadowRun.objects.get(pk=run.pk).evidence_id != run.evidence_id
