"""The evidence jobs speak one status vocabulary: every kind's words are the job words, plus
only the extras that mean something none of them does; and every kind has the job columns."""

from __future__ import annotations

import pytest

from fleetctl.bench.models import Run
from fleetctl.conformance.models import ConformanceRun
from fleetctl.core.jobs import ACTIVE, Job, JobStatus
from fleetctl.evals.models import EvalRun
from fleetctl.shadow.models import ShadowRun
from migrations_plan.jobs import PlanJob

# kind -> (words it adds, job words it never reaches)
KINDS = {
    Run: ({"partial"}, set()),
    ConformanceRun: (set(), set()),
    EvalRun: (set(), set()),
    # Nothing queues a shadow run, and a person stops one rather than cancelling it.
    ShadowRun: ({"stopped"}, {"queued", "cancelled"}),
}
SUCCESS_WORDS_GONE = {"done", "finished", "completed", "passed"}


@pytest.mark.parametrize("kind", list(KINDS), ids=lambda k: k.__name__)
def test_each_kind_speaks_the_job_words_and_only_its_own_extras(kind):
    extras, unreached = KINDS[kind]
    words = {value for value, _ in kind._meta.get_field("status").choices}
    assert words == (set(JobStatus.values) - unreached) | extras
    assert not words & SUCCESS_WORDS_GONE
    assert kind._meta.get_field("status").max_length >= max(len(w) for w in words)
    for word in set(JobStatus.values) - unreached:  # a job word means the same everywhere
        assert kind.Status(word).label.split(" ")[0] == word


@pytest.mark.parametrize("kind", list(KINDS), ids=lambda k: k.__name__)
def test_each_kind_has_the_job_columns_and_the_plan_bound_ones_a_plan(kind):
    assert issubclass(kind, Job)
    names = {f.name for f in kind._meta.get_fields()}
    assert {"status", "error", "worker", "created_by", "created_at", "started_at",
            "finished_at", "heartbeat_at", "cancelled_by"} <= names
    assert kind.ACTIVE == ACTIVE == ("queued", "running")
    assert issubclass(kind, PlanJob) == (kind is not Run)
    if kind is not Run:
        assert {"plan", "plan_stage"} <= names
