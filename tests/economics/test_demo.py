"""`make demo`'s business case: the seed queues one short real benchmark of the MI300X plan's
two pools together and sets the plan's expected volume; a real worker runs the benchmark
against the demo's simulated pools, and a platform lead opening the plan's business case
reads a verdict on measured costs (whichever it is: the simulator decides, not the test)."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.test import Client

from fleetctl.economics.models import BusinessCase
from tests.economics.test_report import _pdf_text
from tests.fleet.test_demo_seed import SEED


@pytest.mark.slow
def test_the_demo_mi300x_plan_has_a_measured_business_case(celery_worker, tmp_path,
                                                           monkeypatch):
    from fleetctl.bench.models import Run
    from fleetctl.demo import business_case, capacity_run
    from tests.sim import simproc
    from tests.support.waiting import wait_until

    # The demo's benchmark runs, shortened (one level of a 3 s window): the same code
    # queues them and the same worker runs them.
    monkeypatch.setattr(capacity_run, "LEVELS", [2])
    monkeypatch.setattr(capacity_run, "WARMUP_S", 1.0)
    monkeypatch.setattr(capacity_run, "WINDOW_S", 3.0)
    monkeypatch.setattr(capacity_run, "MIN_SAMPLES", 3)
    args = [a if a != "8100" else "{base}" for a in SEED]
    with simproc.demo_fleet(tmp_path / "sim.log") as base:
        for _ in range(2):  # the re-run keeps the run and the stored case
            call_command(*[a.format(base=base) for a in args], stdout=io.StringIO(),
                         stderr=io.StringIO())
        [run] = Run.objects.filter(name=business_case.NAME)
        assert sorted(run.pools.values_list("name", flat=True)) == ["h200-us-east",
                                                                    "mi300x-us-east"]
        wait_until(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, timeout_s=400,
                   what="the seed's business-case benchmark to finish")
    run.refresh_from_db()
    assert run.status == "complete", (run.status, run.error, run.progress)
    stored = BusinessCase.objects.get(plan__name=business_case.PLAN)
    assert str(stored.expected_mtokens_per_month) == "3000.000"

    page = Client()
    page.force_login(User.objects.get(username="lead"))
    plan_page = page.get(f"/plans/{business_case.PLAN}/").content.decode()
    assert "Open the business case" in plan_page
    response = page.get(f"/plans/{business_case.PLAN}/business-case/")
    assert response.status_code == 200
    case = response.context["case"]
    assert case.verdict in {"pays", "does-not-pay", "justified"}, case.headline
    assert "the measured arbitrage is" in case.headline, case.headline
    assert case.numbers["comparison"]["runs"] == [run.pk, run.pk]
    print("demo business case:", case.headline)
    # ... and downloads the plan's migration report as a PDF, the business case in it.
    pdf = page.get(f"/plans/{business_case.PLAN}/report.pdf")
    assert pdf.status_code == 200 and pdf["Content-Type"] == "application/pdf"
    assert pdf.content.startswith(b"%PDF-")
    assert case.verdict_words in " ".join(_pdf_text(pdf.content).split())
