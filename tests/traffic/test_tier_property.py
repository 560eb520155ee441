"""A stateful property test (hypothesis) over context tiers (issue 28): tiers set and
cleared on routes, pools' registered and reported context changed, weights added and taken
away; after every step the rendered Envoy config never sends a tier's prompts to a pool
below the tier's context or outside the route's pin, and a tier no pool with weight can
serve answers itself (413 for reject, 503 otherwise). The machine is tier_machine.py; the
caller's size header in attacker spellings, through a real Envoy, is
tests/traffic/envoy/test_tier_spellings.py."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from fleetctl.fleet.models import Pool
from fleetctl.traffic.models import ContextTier, Gateway, Route
from tests.traffic.tier_machine import TierMachine, build_world, rendered_problems

pytestmark = [pytest.mark.django_db, pytest.mark.slow]


def test_no_sequence_of_tier_context_and_split_changes_breaks_the_rendered_tiers() -> None:
    # Each step is a few queries and one render (no Envoy): 20 sequences of up to 20 steps
    # take ~25 s on a shared 2-core machine. Generation only: a failure prints its steps.
    run_state_machine_as_test(TierMachine, settings=settings(
        max_examples=20, stateful_step_count=20, deadline=None, database=None,
        phases=[Phase.generate], suppress_health_check=list(HealthCheck)))


def test_the_property_sees_a_small_pool_in_a_large_tier(monkeypatch: pytest.MonkeyPatch
                                                        ) -> None:
    """The invariant is not blind: tiers whose stored rows say one thing while a pool's
    context was lowered behind the guard's back (an UPDATE, as a bug would) are caught."""
    from fleetctl.fleet.models import PoolModel
    from fleetctl.traffic import services as traffic
    from tests.conftest import SYSTEM

    build_world()
    route = Route.objects.get(name="eu")
    traffic.revision_create(actor=SYSTEM, route=route, weights={"eu-l": 50, "eu-m": 50},
                            base_revision=route.revision_number, reason="t")
    traffic.route_tiers_set(actor=SYSTEM, route=route, tiers=[
        {"max_prompt_tokens": 32768, "behaviour": "failover"}, {"behaviour": "reject"}])
    assert rendered_problems(Gateway.objects.get(name="tier-edge")) == []
    # The guard refuses this edit (409); written past it, the renderer drops the pool (the
    # tiers are computed at render time), so the property holds...
    PoolModel.objects.filter(pool__name="eu-m").update(max_context_tokens=8192)
    assert rendered_problems(Gateway.objects.get(name="tier-edge")) == []
    # ...and when the config itself names a pool below the tier, it is a problem.
    from fleetctl.traffic.gateways.envoy import render as envoy_config

    real = envoy_config.render

    def widened(desired):  # type: ignore[no-untyped-def]
        from dataclasses import replace

        routes = tuple(replace(r, tiers=tuple(replace(t, pools=("eu-l", "eu-m"))
                                              for t in r.tiers)) if r.key == "eu" else r
                       for r in desired.routes)
        return real(replace(desired, routes=routes))

    monkeypatch.setattr(envoy_config, "render", widened)
    found = rendered_problems(Gateway.objects.get(name="tier-edge"))
    assert any("eu-m" in p and "below the tier's 32768 tokens" in p for p in found), found
    assert ContextTier.objects.filter(route=route).count() == 2
    assert Pool.objects.filter(name="eu-m").exists()
