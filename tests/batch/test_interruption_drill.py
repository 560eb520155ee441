"""A drill-priced interruption tax: a real kill-worker drill (real worker processes, a real
simulator pool) on an interruptible pool, and the tax fleetctl/fleet/interruption.py prices
from it — re-warm = the drill's measured resume time, lost work = the requests it resent ×
the job's measured mean request latency — shown itemised on the pool's page and API."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.db.models import Avg

from fleetctl.batch.evidence import DRILL_KIND
from fleetctl.batch.models import BatchResult
from fleetctl.fleet import services as fleet
from fleetctl.fleet.interruption import effective_rate
from fleetctl.fleet.models import Pool
from migrations_plan.models import Evidence
from tests.conftest import SYSTEM
from tests.support.waiting import wait_until

from .test_drill import drill_job, judged
from .workerproc import WorkerProcess, worker_starter

pytestmark = pytest.mark.slow


@pytest.fixture
def workers(tmp_path: Path, transactional_db: None) -> Iterator[Callable[..., WorkerProcess]]:
    with worker_starter(tmp_path) as start:
        yield start


def test_a_real_drill_prices_the_interruption_tax(
        sim_pool: Pool, tmp_path: Path, workers: Callable[..., WorkerProcess],
        client_for: Any) -> None:
    pool = fleet.pool_update(actor=SYSTEM, pool=sim_pool, interruptible=True,
                             reclaims_per_month=Decimal("30"), standby_pct=Decimal("5"))
    assert "run a drill on batch-sim" in effective_rate(pool).not_measured

    job = drill_job(pool, tmp_path, "kill-worker")
    first, _second = workers("d"), workers("d")  # the second takes the lapsed chunk over
    wait_until(lambda: judged(job), timeout_s=40, what=f"the verdict\n{first.log()}")
    assert job.drill_verdict == "pass", job.drill_summary

    evidence = Evidence.objects.get(kind=DRILL_KIND, pool=pool)
    mean_ms = BatchResult.objects.filter(job=job).aggregate(m=Avg("latency_ms"))["m"]
    tax = effective_rate(Pool.objects.get(pk=pool.pk))
    assert tax.not_measured == "" and tax.drill is not None
    assert tax.drill.evidence_id == evidence.pk and tax.drill.source == f"batch job {job.pk}"
    assert tax.drill.rewarm_s == evidence.data["resume_s"] > 0
    assert tax.drill.redone == evidence.data["resends"] >= 1  # the kill caught some in flight
    assert tax.drill.mean_request_s == pytest.approx(mean_ms / 1000)
    lost = evidence.data["resends"] * mean_ms / 1000
    assert tax.drill.lost_s == pytest.approx(lost)
    # 30 reclaims a month ÷ 730 h × (re-warm + lost) ÷ 3600, plus 5 % standby.
    share = 30 / 730 * (evidence.data["resume_s"] + lost) / 3600
    assert float(tax.factor or 0) == pytest.approx(1 + share + 0.05)
    assert float(tax.reclaim_per_h or 0) == pytest.approx(10.50 * share)
    assert tax.standby_per_h == Decimal("0.525")

    viewer = client_for("viewer")
    api = viewer.get("/api/v1/pools/batch-sim/").json()["interruption_tax"]
    assert api["drill"]["evidence"] == evidence.pk and api["not_measured"] is None
    page = viewer.get("/pools/batch-sim/").content.decode()
    assert "Interruption tax" in page and f"the drill of batch job {job.pk}" in page
    assert f'{tax.drill.rewarm_s:.1f} s' in page
