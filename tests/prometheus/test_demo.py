"""The demo's Prometheus, for real: the simulated fleet `make demo` starts, the seed, the
Prometheus devstack starts (scraping the pools, the generated rules of every pool loaded) and
`manage.py demo_prometheus`: the MI300X plan's stage-2 dashboards check reads "measured: 6
rules loaded"."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command

from fleetctl.core.ports import free_port
from fleetctl.demo.devstack import DEMO_SIM_POOLS, demo_prometheus
from fleetctl.demo.prometheus_process import INSTALL_HINT, prometheus_binary
from fleetctl.prometheus import evidence, services
from fleetctl.ramps.models import Ramp
from migrations_plan.evidence import evaluate_gate
from migrations_plan.models import Plan
from tests.sim import simproc
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.django_db]


@pytest.fixture
def demo_fleet(tmp_path: Path) -> Iterator[int]:
    with simproc.demo_fleet(tmp_path / "sim.log") as base:
        yield base


def test_the_demo_measures_the_mi300x_dashboards_check(demo_fleet, tmp_path):
    if prometheus_binary() is None:
        pytest.fail(INSTALL_HINT)
    prometheus = demo_prometheus(tmp_path / "prometheus", demo_fleet, free_port(), free_port())
    call_command("demo_seed", "--password=demo-pw", "--sim-base-port", str(demo_fleet),
                 "--gateway-admin", "http://127.0.0.1:1",
                 "--gateway-config-dir", str(tmp_path / "envoy"),
                 "--prometheus-url", prometheus.url)
    prometheus.start()
    try:
        # The seeded ramp's guard lists a Prometheus query beside its own telemetry.
        ramp = Ramp.objects.get(pool__name="gaudi3-in-west")
        assert [m["source"] for m in ramp.metric_checks] == ["prometheus"]
        measured = wait_until(lambda: [m for m in services.ramp_metrics_measure(
            ramp.metric_checks, pool=ramp.pool.name, route=ramp.route.name, model="m")
            if m.status == "pass"], what="the guard's query to pass", explain=prometheus.log)
        assert measured[0].reason.startswith("queue depth (Prometheus) = 0")
        # A telemetry source too: the ingester's next round reads every pool through it
        # (the pools are scraped: the first read finds their counters, without an error).
        from fleetctl.prometheus.telemetry import PrometheusReader
        from fleetctl.telemetry.models import Cursor

        simulated = {name.removesuffix("-2") for name, _, _ in DEMO_SIM_POOLS}

        def every_simulated_pool_read() -> bool:
            PrometheusReader().read_all()
            return {path.removeprefix("prometheus:") for path in Cursor.objects.filter(
                source_name="prometheus", last_error="").values_list("path", flat=True)
            } >= simulated

        wait_until(every_simulated_pool_read,
                   what="every simulated pool's histograms in the demo's Prometheus",
                   explain=lambda: "\n".join(Cursor.objects.filter(
                       source_name="prometheus").values_list("last_error", flat=True)))
        call_command("demo_prometheus", "--url", prometheus.url,
                     "--rules-dir", str(tmp_path / "prometheus" / "rules"))
        plan = Plan.objects.get(name="mi300x-llama-8b")
        check = plan.checks.get(stage=2, key="dashboards", removed_at__isnull=True)
        assert check.rule == evidence.ALERTS_RULE
        outcome = next(o for o in evaluate_gate(plan, stage=2).outcomes
                       if o.check.pk == check.pk)
        assert outcome.result.status == "pass", outcome.result.summary
        assert outcome.result.summary.startswith("measured: 6 rules loaded in prometheus")
    finally:
        prometheus.stop()
