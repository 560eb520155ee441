"""A pool's SLO-qualified capacity from its benchmark evidence (fleetctl/bench/capacity.py
through fleetctl/traffic/capacity.py), the load it carries now, and the split in proportion
to capacity."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.fleet.services import pool_update
from fleetctl.traffic.capacity import live_streams, pool_capacities, proportional_weights
from fleetctl.traffic.models import Gateway, PoolTrafficSample
from migrations_plan import services as plans
from tests.migrations_plan.conftest import MODEL, world  # noqa: F401

BOT = Actor.for_system("benchmark")


def _bench(pool, *, run, best, tokens, endpoints=None, timing="concurrency", model=MODEL):
    data = {"run": run, "timing": timing, "best_concurrency": best,
            "output_tokens_per_s": tokens, "cost_per_1m": None, "measured_on": "2026-12-01",
            "slo": {"ttft_p95_ms": 800, "tpot_p95_ms": 60, "error_rate": 0.01}}
    if endpoints is not None:
        data["endpoints"] = endpoints
    return plans.evidence_record(actor=BOT, pool=pool, kind="benchmark", verdict="pass",
                                 summary=f"run {run}", data=data, model_id=model,
                                 source=f"benchmark run {run}")


def test_capacity_is_the_newest_counting_benchmark_scaled_by_endpoints(world):  # noqa: F811
    primary, candidate = world.primary, world.candidate
    found = pool_capacities(MODEL, [primary, candidate])
    assert not found["h200-us"].known
    assert "no benchmark of it for llama-3.1-8b-instruct yet" in found["h200-us"].source

    _bench(primary, run=1, best=8, tokens=800.0, endpoints=1)
    _bench(primary, run=2, best=None, tokens=None, endpoints=1)  # no level met the SLO
    _bench(candidate, run=3, best=4, tokens=400.0, endpoints=1, model="")  # no model named
    found = pool_capacities(MODEL, [primary, candidate])
    # The newest run met the SLO nowhere: the one before it is the figure, not zero.
    assert (found["h200-us"].run, found["h200-us"].streams, found["h200-us"].tokens_per_s) \
        == (1, 8.0, 800.0)
    assert not found["mi300x-us"].known  # its only run names no model

    # Two endpoints now, one then: twice the capacity, and the source says so.
    pool_update(actor=BOT, pool=primary, base_urls=[*primary.base_urls,
                                                    "http://127.0.0.1:9/v1"])
    primary.refresh_from_db()
    cap = pool_capacities(MODEL, [primary])["h200-us"]
    assert (cap.streams, cap.tokens_per_s) == (16.0, 1600.0)
    assert "scaled from 1 endpoint(s) then to 2 now" in cap.source

    # A new runtime: the pool is no longer what was measured.
    pool_update(actor=BOT, pool=primary, runtime_version="vllm-9.9")
    primary.refresh_from_db()
    cap = pool_capacities(MODEL, [primary])["h200-us"]
    assert not cap.known and "runtime version changed" in cap.source

    _bench(candidate, run=4, best=None, tokens=None, timing="trace")
    assert "trace timing" in pool_capacities(MODEL, [candidate])["mi300x-us"].source


def test_live_streams_sum_each_gateways_newest_recent_sample(world):  # noqa: F811
    now = timezone.now()
    a = Gateway.objects.create(name="gw-a", kind="envoy", admin_address="http://127.0.0.1:1")
    b = Gateway.objects.create(name="gw-b", kind="envoy", admin_address="http://127.0.0.1:2")
    for gateway, active, ago in ((a, 9, 30), (a, 5, 5), (b, 3, 10), (b, 40, 600)):
        PoolTrafficSample.objects.create(gateway=gateway, pool="h200-us", active=active,
                                         requests_total=0, errors_total=0,
                                         at=now - timedelta(seconds=ago))
    PoolTrafficSample.objects.create(gateway=a, pool="mi300x-us", active=7, requests_total=0,
                                     errors_total=0, at=now - timedelta(seconds=600))
    # gw-a's newest (5) + gw-b's newest recent (3); the MI300X was not sampled lately.
    assert live_streams(["h200-us", "mi300x-us"], now=now) == {"h200-us": 8}


def test_proportional_weights_sum_to_the_whole():
    assert proportional_weights({"a": 300.0, "b": 100.0, "c": 0.0}) == {"a": 7500, "b": 2500}
    weights = proportional_weights({"a": 1.0, "b": 1.0, "c": 1.0})
    assert sum(weights.values()) == 10_000 and sorted(weights.values()) == [3333, 3333, 3334]
    assert proportional_weights({"a": 0.0}) == {}
