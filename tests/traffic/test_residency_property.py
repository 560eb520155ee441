"""A stateful property test (hypothesis) over registry and traffic operations through
REST, guarded ramps driven by their controller, health flips under the health policy and a
migration plan moved through its stages: after every step the real Envoy must send pinned
requests only to pools, and endpoints, registered in the pin's jurisdiction, and give the
plan's candidate only the weight its stage allows. The machine is in residency_machine.py;
benchmarks/residency_fuzz.py runs it for 1,000+ sequences."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, Phase, settings

from fleetctl.traffic.services import gateway_create
from tests.conftest import SYSTEM
from tests.traffic.residency_machine import make_machine

pytestmark = pytest.mark.slow


def test_no_sequence_of_registry_and_traffic_changes_sends_pinned_traffic_abroad(
    celery_worker, envoy, client_for
):
    from hypothesis.stateful import run_state_machine_as_test

    gateway = gateway_create(actor=SYSTEM, name="fuzz-edge", kind="envoy",
                             admin_address=envoy.admin_url,
                             options={"config_dir": str(envoy.workdir), "load_timeout_s": 30})
    machine = make_machine(client_for("admin"), gateway, itertools.count(1))

    run_state_machine_as_test(machine, settings=settings(
        # Ten sequences of up to 18 steps: the rules for ramps and health flips need a few
        # steps to build on each other (start, tick, move, resume...) in one sequence.
        max_examples=10, stateful_step_count=18, deadline=None, database=None,
        # No shrinking: each step waits on a real Envoy, and the failing sequence is printed
        # step by step anyway.
        phases=[Phase.generate], suppress_health_check=list(HealthCheck)))
