"""An eval run's cost per item passed, per pool (fleetctl/evals/selectors.py
`run_task_costs`, the formula in fleetctl/fleet/costs.py): a real run driven by the session's
Celery worker on a simulated candidate and on a pool whose endpoint refuses connections (each
item tried max_attempts times, none passed: not measured, never 0)."""

from __future__ import annotations

import io
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

import pytest
from django.urls import reverse

from fleetctl.evals import bundled, selectors, services
from fleetctl.evals.models import EvalResult
from fleetctl.fleet.models import Pool
from tests.evals.test_runs import (  # noqa: F401  (sims, sim_pool: fixtures)
    SYSTEM,
    closed_port_url,
    finished,
    lead,
    sim_pool,
    sims,
)

pytestmark = pytest.mark.slow


def arithmetic(n: int) -> Any:
    """The bundled arithmetic suite's first `n` items (the simulator solves them at its
    profile's accuracy), uploaded."""
    lines = bundled.suite_lines("fleetctl-arithmetic")[:n + 1]
    made, _ = services.suite_upload(
        actor=SYSTEM, name="arith-cost", fileobj=io.BytesIO(("\n".join(lines) + "\n").encode()))
    return made


def test_an_eval_runs_cost_per_item_passed_on_each_pool(
        celery_worker: Any, sims: Any, sim_pool: Any, make_user: Any,  # noqa: F811
        client_for: Any) -> None:
    cand = sim_pool("cand", sims.url("a1"))
    down = sim_pool("down", closed_port_url())
    Pool.objects.filter(pk__in=[cand.pk, down.pk]).update(node_hourly_rate=Decimal("3600.00"))
    run = services.run_create(actor=lead(make_user), suite=arithmetic(8), candidate=cand,
                              primary=down, concurrency=4, max_attempts=3, min_items=2)
    run = finished(run)
    assert run.status == "complete" and run.started_at and run.finished_at
    seconds = (run.finished_at - run.started_at).total_seconds()
    spent = (Decimal("3600.00") * Decimal(str(seconds)) / 3600).quantize(
        Decimal("1e-8"), rounding=ROUND_HALF_UP)
    passed = EvalResult.objects.filter(run=run, run_pool__pool=cand, score__gte=1).count()
    assert passed > 0

    costs = {c.pool: c for c in selectors.run_task_costs(selectors.run_get(run.pk))}
    mine = costs["cand"]
    assert mine.seconds == seconds and mine.spend == str(spent) and spent > 0
    assert (mine.succeeded, mine.failed, mine.retries, mine.attempts) == (
        passed, 8 - passed, 0, 8)
    assert mine.cost_per_success == str((spent / passed).quantize(
        Decimal("1e-8"), rounding=ROUND_HALF_UP))
    assert "item passed" in mine.how
    # Every item tried three times, none answered: the same spend, nothing passed.
    dead = costs["down"]
    assert (dead.succeeded, dead.failed, dead.retries, dead.attempts) == (0, 8, 16, 24)
    assert dead.cost_per_success is None and dead.spend == str(spent)
    assert dead.not_measured == (f"not measured: no item passed yet (24 attempts, 8 failed); "
                                 f"{spent} USD spent")

    viewer = client_for("viewer")
    body = viewer.get(f"/api/v1/eval-runs/{run.pk}/").json()
    assert body["task_costs"] == [mine.as_dict(), dead.as_dict()]
    page = viewer.get(reverse("evals:run-detail", args=[run.pk])).content.decode()
    assert "Cost per item passed" in page and mine.how in page and dead.not_measured in page
