"""The demo's probes, for real: the simulated fleet `make demo` starts (the A100 on the
legacy serving profile), the seed with --conformance as `make demo` runs it, and a worker on
the probe queue. The A100 plan's probe fails on tools and prompt-token parity (its stage-1 check
fails; the demo signed that stage off for batch work before the probe ran); the MI300X
candidate's passes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import call_command

from fleetctl.conformance.models import ConformanceRun
from migrations_plan import evidence as ev
from migrations_plan.models import Plan
from tests.sim import simproc
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
def demo_fleet(tmp_path: Path) -> Iterator[int]:
    with simproc.demo_fleet(tmp_path / "sim.log") as base:
        yield base


def test_the_demo_probes_fail_the_a100_on_tools_and_parity_and_pass_the_mi300x(
        celery_worker, demo_fleet):
    call_command("demo_seed", "--password=demo-pw", "--sim-base-port", str(demo_fleet),
                 "--gateway-admin", "http://127.0.0.1:1",
                 "--gateway-config-dir", "/tmp/fleetctl-demo-test", "--conformance")
    assert ConformanceRun.objects.count() == 2
    wait_until(lambda: not ConformanceRun.objects.filter(
        status__in=ConformanceRun.ACTIVE).exists(), timeout_s=240, what="the demo's probes")
    a100 = ConformanceRun.objects.get(pool__name="a100-eu-central")
    mi300x = ConformanceRun.objects.get(pool__name="mi300x-us-east")
    assert (a100.status, a100.verdict) == ("complete", "fail"), a100.error
    assert a100.primary.name == "h200-us-east" and a100.plan.name == "a100-llama-8b"
    evidence = a100.pool.evidence.get(kind="conformance")
    assert set(evidence.data["required_failing"]) == {"tools.required", "tools.named",
                                                      "parity.prompt_tokens"}
    assert "tokens vs h200-us-east" in a100.summary
    assert (mi300x.status, mi300x.verdict) == ("complete", "pass"), mi300x.summary

    plan = Plan.objects.get(name="a100-llama-8b")
    # The demo's A100 plan was signed through stages 1 and 2 for batch work before its probe
    # ran (the leads' justification says batch jobs use no tools); its stage-1 check now shows
    # the probe's failure for the record.
    check = next(o for o in ev.evaluate_gate(plan, stage=1).outcomes
                 if o.check.key == "conformance")
    assert check.status == ev.FAIL
