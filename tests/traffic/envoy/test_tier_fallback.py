"""A context tier's per-request fallback and bounded queue on Envoy (fallback.py): the
rendered clusters and entries, what `envoy --mode validate` accepts, the access log's
attribution, and a real Envoy in front of simulated pools — a pool killed mid-traffic, a
pinned tier that never falls over, no fallback across a border, into another latency class
or onto a drained pool, the counts in telemetry, and a full queue answering 429."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from django.utils import timezone

from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess, validate_config
from fleetctl.telemetry import selectors as telemetry
from fleetctl.telemetry.follow import Aggregator
from fleetctl.telemetry.ingest import Ingester
from fleetctl.traffic.gateways.base import (
    DesiredState,
    LogRecord,
    PoolTarget,
    RouteSpec,
    TierSpec,
)
from fleetctl.traffic.gateways.envoy import render as envoy_config
from fleetctl.traffic.gateways.envoy.accesslog import parse_line
from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter, held_weights
from fleetctl.traffic.gateways.envoy.fallback import pool_of
from fleetctl.traffic.gateways.envoy.names import QUEUE_SLOTS_PER_ENDPOINT
from fleetctl.traffic.models import Gateway
from tests.sim.simproc import MODEL, SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until
from tests.traffic.accesslog import log_offset, read_records

# EU interactive pools that may stand in for each other, one of another class, one across
# the border, one drained (0 %): the only pool a killed `victim`'s requests may go to is
# `peer`.
JURISDICTION = {"victim": "EU", "peer": "EU", "batchy": "EU", "drained": "EU", "us": "US"}
LATENCY = {"victim": "interactive", "peer": "interactive", "batchy": "batch",
           "drained": "interactive", "us": "interactive"}
SPLIT = {"victim": 4000, "peer": 2000, "batchy": 2000, "us": 2000, "drained": 0}
NAMES = tuple(JURISDICTION)


def targets(urls: dict[str, str], **slots: int) -> dict[str, PoolTarget]:
    return {name: PoolTarget(name, (url,), JURISDICTION[name], latency_class=LATENCY[name],
                             slots=slots.get(name)) for name, url in urls.items()}


def tiered(weights: dict[str, int], *tiers: TierSpec, key: str = "chat",
           residency: str = "") -> RouteSpec:
    return RouteSpec(key=key, model=MODEL, latency_class="", residency=residency, revision=1,
                     weights=weights, tiers=tiers)


def one_tier(behaviour: str, **kw: Any) -> TierSpec:
    return TierSpec(bound=None, above=0, behaviour=behaviour, pools=NAMES, **kw)


FAKE_URLS = {name: f"http://127.0.0.1:{8101 + i}" for i, name in enumerate(NAMES)}


def render(behaviour: str, weights: dict[str, int] | None = None,
           **kw: Any) -> envoy_config.RenderedConfig:
    return envoy_config.render(DesiredState(
        routes=(tiered(weights or SPLIT, one_tier(behaviour, **kw)),),
        pools=targets(FAKE_URLS)))


def tier_entry(rendered: envoy_config.RenderedConfig) -> dict[str, Any]:
    routes = rendered.route_config["virtual_hosts"][0]["routes"]
    return next(e for e in routes if e["name"] == "chat" and "metadata" in e)


def tries(rendered: envoy_config.RenderedConfig) -> dict[str, list[str]]:
    """Pool -> the clusters its share of the tier tries, in order."""
    found = {}
    for cluster in tier_entry(rendered)["route"]["weighted_clusters"]["clusters"]:
        name = cluster["name"]
        aggregate = rendered.clusters[name].get("cluster_type")
        found[pool_of(name)] = (aggregate["typed_config"]["clusters"] if aggregate
                                else [name])
    return found


# --- rendering ---------------------------------------------------------------------------

def test_failover_tries_the_tiers_other_pools_of_the_jurisdiction_never_a_drained_one() -> None:
    rendered = render("failover")
    assert tries(rendered) == {
        "victim": ["victim", "batchy", "peer"],  # EU, with weight, name order (any class)
        "peer": ["peer", "batchy", "victim"],
        "batchy": ["batchy", "peer", "victim"],
        "us": ["us"],  # nothing across the border
        "drained": ["drained"],  # at 0 %: no first tries, and in no list
    }
    policy = tier_entry(rendered)["route"]["retry_policy"]
    assert policy["retry_priority"]["name"] == "envoy.retry_priorities.previous_priorities"
    assert policy["retry_on"] == "connect-failure,refused-stream,reset-before-request"
    assert policy["retry_back_off"]["base_interval"] == "0.001s"  # it goes to another pool
    aggregate = rendered.clusters[next(n for n in rendered.clusters if n.startswith("victim_"))]
    assert aggregate["lb_policy"] == "CLUSTER_PROVIDED"
    # The route's own entry (no size header) keeps same-pool retries.
    own = next(e for e in rendered.route_config["virtual_hosts"][0]["routes"]
               if e["name"] == "chat" and "metadata" not in e)
    assert not {"retry_priority", "retry_back_off"} & set(own["route"]["retry_policy"])
    assert held_weights(rendered.route_config, rendered.runtime_values) == {
        "chat": {p: w for p, w in SPLIT.items() if w}}


def test_failover_class_stays_in_the_class_and_pinned_or_reject_never_fall_over() -> None:
    assert tries(render("failover-class")) == {
        "victim": ["victim", "peer"], "peer": ["peer", "victim"], "batchy": ["batchy"],
        "us": ["us"], "drained": ["drained"]}
    for behaviour in ("pinned", "reject"):
        rendered = render(behaviour)
        assert tries(rendered) == {p: [p] for p in NAMES}
        assert set(rendered.clusters) == set(NAMES)
        assert "retry_priority" not in tier_entry(rendered)["route"]["retry_policy"]


def test_a_queue_tier_has_its_own_bounded_clusters_and_falls_over_within_the_class() -> None:
    rendered = render("queue", queue_max=3, retry_after_s=9)
    found = tries(rendered)
    assert {pool: [pool_of(c) for c in chain] for pool, chain in found.items()} == {
        "victim": ["victim", "peer"], "peer": ["peer", "victim"], "batchy": ["batchy"],
        "us": ["us"], "drained": ["drained"]}
    queue = rendered.clusters[found["victim"][0]]
    assert queue["load_assignment"]["endpoints"] == rendered.clusters["victim"][
        "load_assignment"]["endpoints"]
    assert queue["circuit_breakers"]["thresholds"][0] | {} == {
        "max_connections": QUEUE_SLOTS_PER_ENDPOINT, "max_pending_requests": 3,
        "max_requests": 100_000, "max_retries": 100_000}
    answer = tier_entry(rendered)["metadata"]["filter_metadata"]["envoy.filters.http.lua"]
    assert answer["retry_after"] == "9"
    error = json.loads(answer["queue_full_body"])["error"]
    assert error["code"] == "tier_queue_full" and "queue" in error["message"]
    # Only a gateway with a queue tier runs Lua on its answers.
    assert "envoy_on_response" in lua_source(rendered)
    assert "envoy_on_response" not in lua_source(render("failover"))


def lua_source(rendered: envoy_config.RenderedConfig) -> str:
    per_filter = rendered.route_config["virtual_hosts"][0]["typed_per_filter_config"]
    return str(per_filter["envoy.filters.http.lua"]["source_code"]["inline_string"])


def test_a_ramp_stays_a_runtime_change_and_a_drain_changes_the_fallback_lists() -> None:
    before = render("failover")
    ramped = render("failover", {**SPLIT, "victim": 3000, "peer": 3000})
    assert (ramped.routes_version, ramped.clusters_version) == (
        before.routes_version, before.clusters_version)
    drained = render("failover", {**SPLIT, "victim": 0, "peer": 6000})
    assert tries(drained)["peer"] == ["peer", "batchy"]
    assert drained.routes_version != before.routes_version


@pytest.mark.slow
def test_fallback_and_queue_clusters_pass_envoy_validate(tmp_path: Path) -> None:
    tiers = (TierSpec(100, 0, "failover", NAMES),
             TierSpec(None, 100, "queue", NAMES, queue_max=2, retry_after_s=5))
    desired = DesiredState(routes=(tiered(SPLIT, *tiers),), pools=targets(FAKE_URLS))
    ok, output = validate_config(envoy_config.render_validation_bootstrap(desired), tmp_path)
    assert ok, output
    assert "deprecated" not in output.lower()


def test_the_log_names_the_pool_that_answered_and_the_one_the_split_chose() -> None:
    line = {"start": "1.0", "route": "chat", "pool": "victim_fb_0123abcd",
            "answered": "peer", "status": 200, "duration_ms": 5, "ttft_ms": 5, "bytes": 10,
            "attempts": 2, "ctype": "application/json", "flags": "-"}
    record = parse_line(json.dumps(line).encode(), {})
    assert record is not None and (record.pool, record.fallback_from) == ("peer", "victim")
    same = parse_line(json.dumps({**line, "answered": "victim"}).encode(), {})
    assert same is not None and (same.pool, same.fallback_from) == ("victim", "")
    # No endpoint answered (a full queue): the split's pool, and the tier's limit is no
    # failure of it; an older line without `answered` reads as before.
    full = parse_line(json.dumps({**line, "pool": "victim_q_0123abcd", "answered": None,
                                  "status": 429, "flags": "UO"}).encode(), {})
    assert full is not None and (full.pool, full.fallback_from, full.ended_by) == (
        "victim", "", "")
    old = {k: v for k, v in line.items() if k != "answered"}
    record = parse_line(json.dumps({**old, "pool": "peer"}).encode(), {})
    assert record is not None and (record.pool, record.fallback_from) == ("peer", "")


def test_a_fallback_counts_on_the_answering_pool_and_as_fell_over_on_the_chosen() -> None:
    aggregator = Aggregator(10)
    record = LogRecord(start=100.0, route="chat", pool="peer", status=200, duration_ms=5,
                       ttft_ms=5, bytes_out=1, attempts=2, streamed=False,
                       fallback_from="victim")
    aggregator.add("gw", record)
    aggregator.add("gw", replace(record, fallback_from="", attempts=1))
    counts = {d.pool: d.counts for d in aggregator.take()}
    assert counts["peer"]["fallbacks"] == 1 and counts["peer"]["requests"] == 2
    assert counts["peer"]["retries"] == 1
    assert counts["victim"]["fell_over"] == 1 and counts["victim"]["requests"] == 0


# --- through a real Envoy ----------------------------------------------------------------

@dataclass
class Rig:
    process: EnvoyProcess
    adapter: EnvoyAdapter
    shared: SimProcess  # every pool but the victim
    folder: Path

    def urls(self, victim: SimProcess | None) -> dict[str, str]:
        urls = {name: self.shared.url(name) for name in NAMES if name != "victim"}
        urls["victim"] = victim.url("victim") if victim else f"http://127.0.0.1:{free_port()}"
        return urls

    def send(self, **headers: str) -> httpx.Response:
        body = {"model": MODEL, "max_tokens": 1,
                "messages": [{"role": "user", "content": "hello"}]}
        return httpx.post(f"{self.process.listen_url}/v1/chat/completions", json=body,
                          timeout=60, headers={"x-request-id": f"req-{uuid.uuid4().hex}",
                                               **headers})

    def records(self, since: int, count: int) -> list[LogRecord]:
        assert self.process.access_log_path is not None
        return read_records(self.process.access_log_path, since, count, parse_line)

    def offset(self) -> int:
        assert self.process.access_log_path is not None
        return log_offset(self.process.access_log_path)

    def served(self, request_ids: set[str]) -> dict[str, str]:
        """Request id -> the pool whose ground truth records it (the shared pools')."""
        found: dict[str, str] = {}

        def recorded() -> bool:
            for pool in NAMES:
                if pool == "victim":
                    continue
                answer = httpx.get(f"{self.shared.url(pool)}/admin/ground-truth",
                                   params={"kind": "requests", "limit": "100000"}, timeout=5)
                for row in answer.json()["requests"]:
                    if row["request_id"] in request_ids:
                        found[row["request_id"]] = pool
            return len(found) >= len(request_ids)

        wait_until(recorded, timeout_s=30, what="the pools to record the requests",
                   explain=lambda: f"{len(found)} of {len(request_ids)}")
        return found

    def stat(self, name: str) -> int:
        text = httpx.get(f"{self.process.admin_url}/stats", params={"filter": f"^{name}$"},
                         timeout=5).text
        return sum(int(line.rpartition(": ")[2]) for line in text.splitlines() if ": " in line)


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    folder = tmp_path_factory.mktemp("fallback")
    shared = sim_with_profiles(folder / "shared", TEST_PROFILES,
                               {name: "quick" for name in NAMES if name != "victim"},
                               models=[MODEL], args=["--record-ground-truth"])
    process = EnvoyProcess(folder / "envoy", free_port(), free_port()).start(timeout_s=60)
    adapter = EnvoyAdapter(process.gateway("fallback-gw", load_timeout_s=30))
    yield Rig(process=process, adapter=adapter, shared=shared, folder=folder)
    process.stop()
    shared.stop()


@pytest.fixture
def victim(rig: Rig) -> Iterator[SimProcess]:
    """The pool a test kills: a simulator of its own (stopping it closes its port)."""
    process = sim_with_profiles(rig.folder / f"victim-{uuid.uuid4().hex[:6]}", TEST_PROFILES,
                                {"victim": "quick"}, models=[MODEL])
    yield process
    process.stop()


def steady_stream(rig: Rig, kill: threading.Event, killed: threading.Event,
                  after: int, **headers: str) -> list[tuple[bool, httpx.Response]]:
    """Requests one after another; `kill` is set after the 10th; `after` more are sent once
    `killed` says the victim is gone. Each: (sent after the kill?, the answer)."""
    sent: list[tuple[bool, httpx.Response]] = []
    while sum(1 for late, _ in sent if late) < after:
        late = killed.is_set()
        sent.append((late, rig.send(**headers)))
        if len(sent) == 10:
            kill.set()
    return sent


@pytest.mark.slow
def test_a_pool_killed_mid_traffic_falls_over_within_tier_class_and_jurisdiction(
        rig: Rig, victim: SimProcess, db: None) -> None:
    Gateway.objects.create(name="fallback-gw", kind="envoy",
                           admin_address=rig.process.admin_url,
                           options={"access_log": str(rig.process.access_log_path)})
    rig.adapter.apply(DesiredState(routes=(tiered(SPLIT, one_tier("failover-class")),),
                                   pools=targets(rig.urls(victim))))
    since, started = rig.offset(), timezone.now() - timedelta(seconds=10)
    kill, killed = threading.Event(), threading.Event()
    sent: list[tuple[bool, httpx.Response]] = []
    client = threading.Thread(target=lambda: sent.extend(
        steady_stream(rig, kill, killed, after=20)))
    client.start()
    assert kill.wait(timeout=60)
    victim.stop()
    killed.set()
    client.join(timeout=120)
    records = rig.records(since, len(sent))
    # Every request answered, but one the victim had taken when it died (reset after the
    # request reached it: never retried, the pool may have begun generating).
    failed = [answer for _, answer in sent if answer.status_code != 200]
    taken = [r for r in records if r.status != 200]
    assert len(failed) == len(taken) <= 1, [a.text for a in failed]
    assert all(r.pool == "victim" and r.attempts == 1 and not r.fallback_from
               for r in taken), taken
    late = [answer for is_late, answer in sent if is_late]
    assert all(answer.status_code == 200 for answer in late)
    # After the kill the victim's share went to `peer` alone: the pools' own ground truth.
    served = rig.served({a.request.headers["x-request-id"] for a in late})
    assert set(served.values()) <= {"peer", "batchy", "us"}
    # The response header names the pool that answered, not the cluster the split chose.
    assert {a.request.headers["x-request-id"]: a.headers["x-fleetctl-pool"]
            for a in late} == served
    fell = [r for r in records if r.fallback_from]
    assert fell and {(r.fallback_from, r.pool) for r in fell} == {("victim", "peer")}
    assert all(r.attempts >= 2 for r in fell)
    # Nothing reached the drained pool, and nothing crossed the border or the class but
    # what the split itself sent there.
    assert "drained" not in served.values()
    assert rig.stat("cluster.drained.upstream_rq_total") == 0
    assert not [r for r in records if r.pool in ("us", "batchy") and r.fallback_from]
    # The counts in telemetry, per pool: the real ingester reads the log.
    ingester = Ingester()
    wait_until(lambda: ingester.once() >= 0 and telemetry.pool_stats(
        pool="peer", route="chat", since=started).fallbacks >= len(fell),
        timeout_s=30, what="the ingester to count the fallbacks")
    assert telemetry.pool_stats(pool="peer", route="chat", since=started).fallbacks == len(fell)
    victim_stats = telemetry.pool_stats(pool="victim", route="chat", since=started)
    assert victim_stats.fell_over == len(fell)
    # The client got its answer, but the victim failed those requests: its error rate
    # (what a ramp guard judges) counts them, in numerator and denominator.
    assert victim_stats.error_rate.n == victim_stats.requests + len(fell)
    assert victim_stats.error_rate.value is not None and victim_stats.error_rate.value >= (
        len(fell) / (victim_stats.requests + len(fell)))
    assert telemetry.pool_stats(pool="us", route="chat", since=started).fallbacks == 0


@pytest.mark.slow
@pytest.mark.parametrize("case", ["pinned tier", "across a border", "pinned route"])
def test_no_fallback_for_a_pinned_tier_nor_across_a_border(
        rig: Rig, victim: SimProcess, case: str) -> None:
    # pinned tier: the victim's EU peer is there, and never used. across a border: the only
    # other pool with weight is in the US. pinned route: an EU route whose tier lists the US
    # pool too (a tier only narrows the route's split, which holds no US pool), beside a
    # route that does send to it.
    headers: dict[str, str] = {}
    routes = [tiered({"victim": 5000, "peer": 5000}, one_tier("pinned"))]
    other = "peer"
    if case == "across a border":
        routes, other = [tiered({"victim": 5000, "us": 5000}, one_tier("failover"))], "us"
    if case == "pinned route":
        headers = {"x-fleetctl-residency": "EU"}
        routes = [tiered({"victim": 10000}, one_tier("failover"), residency="EU"),
                  tiered({"us": 10000}, key="chat-us")]
        other = ""
    rig.adapter.apply(DesiredState(routes=tuple(routes), pools=targets(rig.urls(victim))))
    victim.stop()
    since = rig.offset()
    answers = [rig.send(**headers) for _ in range(12)]
    records = rig.records(since, len(answers))
    assert not [r for r in records if r.fallback_from]
    failed = [a for a in answers if a.status_code != 200]
    assert failed and all(a.status_code == 503 for a in failed)  # the victim's share
    assert {r.pool for r in records if r.status != 200} == {"victim"}
    assert {a.headers["x-fleetctl-pool"] for a in answers if a.status_code == 200} == (
        {other} if other else set())
    if case == "pinned route":  # the US pool was up all along, for its own route
        assert rig.send().headers["x-fleetctl-pool"] == "us"


@pytest.mark.slow
def test_a_full_queue_answers_429_with_retry_after_and_loses_nothing(rig: Rig) -> None:
    urls = rig.urls(None)
    pools = targets(urls, peer=1)  # one slot: the queue fills with a few requests
    tier = one_tier("queue", queue_max=1, retry_after_s=7)
    rig.adapter.apply(DesiredState(routes=(tiered({"peer": 10000}, tier),), pools=pools))
    queue = next(n for n in envoy_config.render(DesiredState(
        routes=(tiered({"peer": 10000}, tier),), pools=pools)).clusters if "_q_" in n)
    fault = httpx.post(f"{urls['peer']}/admin/faults", json={"added_latency_ms": 3000},
                       timeout=5)
    assert fault.status_code == 200, fault.text
    held: list[httpx.Response] = []
    try:
        senders = [threading.Thread(target=lambda: held.append(rig.send())) for _ in range(2)]
        for sender in senders:
            sender.start()
        # One request in the slot, one waiting: the queue is full.
        wait_until(lambda: rig.stat(f"cluster.{queue}.upstream_rq_active") == 1
                   and rig.stat(f"cluster.{queue}.upstream_rq_pending_active") == 1,
                   timeout_s=30, what="the slot and the queue to fill")
        refused = [rig.send() for _ in range(3)]
        for sender in senders:
            sender.join(timeout=60)
    finally:
        httpx.post(f"{urls['peer']}/admin/faults", json={"added_latency_ms": 0}, timeout=5)
    assert rig.stat(f"cluster.{queue}.upstream_rq_pending_overflow") == 3
    for answer in refused:
        assert answer.status_code == 429, answer.text
        assert answer.headers["retry-after"] == "7"
        assert answer.headers["content-type"] == "application/json"
        error = answer.json()["error"]
        assert error["code"] == "tier_queue_full" and "queue" in error["message"]
    # The held ones were answered, by the pool, unchanged; the refused ones never reached it.
    assert [a.status_code for a in held] == [200, 200]
    ids = {a.request.headers["x-request-id"] for a in held}
    assert set(rig.served(ids)) == ids
    assert all(a.json()["choices"] for a in held)
    # The adapter's counters count the queue cluster's requests as the pool's.
    counters = rig.adapter.pool_counters()
    assert not [name for name in counters if "_" in name]
    assert counters["peer"].requests_total >= 2
    refused_ids = {a.request.headers["x-request-id"] for a in refused}
    truth = httpx.get(f"{urls['peer']}/admin/ground-truth",
                      params={"kind": "requests", "limit": "100000"}, timeout=5).json()
    assert not refused_ids & {row["request_id"] for row in truth["requests"]}
