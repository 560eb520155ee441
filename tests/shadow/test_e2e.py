"""Shadow runs end to end, all real: simulated pools, an Envoy gateway pushed by the Celery
worker, the shadow collector process, the worker that runs the triples, the judge and the
plan's gate. Traffic goes through Envoy with the `openai` client, as a caller's would.

The primary pool has two endpoints (two simulated replicas of one profile, each flipping a
few greedy answers at a near-tie, as GPU batches do): the secondary is the other replica, so
primary vs secondary is the noise floor. Candidates are simulated pools with a known
behaviour: a known divergence rate (hard flips), the primary's own profile (A/A), or a
regression (answers cut short). The pools' text is keyed by prompt, so the prompts below give
the same answers on every run; only the replicas' near-tie flips are random.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from django.contrib.auth.models import User
from django.db import connection
from rest_framework.test import APIClient

from fleetctl.accounts.actor import Actor
from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.fleet.models import Pool, Region
from fleetctl.fleet.services import (
    pool_health_record,
    pool_model_create,
    pool_update,
    region_create,
)
from fleetctl.shadow import live, selectors, services, stats
from fleetctl.shadow.models import ShadowJudgement, ShadowPair, ShadowRun
from fleetctl.traffic.models import GatewayPush, Route
from fleetctl.traffic.services import gateway_create, route_create
from migrations_plan import evidence as ev
from migrations_plan import services as plans
from migrations_plan.models import Evidence, Plan
from tests.conftest import SYSTEM
from tests.shadow import collector_proc
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until

MODEL = "llama-3.1-8b-instruct"
KNOWN_RATE = 0.3  # the known-divergence candidate's hard flips, per prompt
SIM_POOLS = {
    # The primary's two replicas, with replica noise (the noise floor) ...
    "prim-a": "replica", "prim-b": "replica",
    # ... and a primary without it, whose answers through Envoy are exactly reproducible.
    "steady-a": "quick", "steady-b": "quick",
    "cand-known": f"replica:divergence_rate={KNOWN_RATE},near_tie_fraction=0",
    "cand-aa": "replica",
    "cand-bad": "replica:truncate_rate=0.5",
    "eu-prim": "quick",
}
MARKER = "zq-marker-7d1c5e"


@dataclass
class Stack:
    sims: SimProcess
    envoy: EnvoyProcess
    collector_url: str


def start_collector(log_dir: Path) -> collector_proc.Running:
    """`python -m fleetctl.shadow.collector` on a free port, on the tests' Redis."""
    from django.conf import settings

    return collector_proc.launch(settings.REDIS_URL, log_dir, PYTHONUNBUFFERED="1")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("shadow-e2e")
    sims = sim_with_profiles(work, TEST_PROFILES, SIM_POOLS, models=[MODEL])
    envoy = EnvoyProcess(work / "envoy", free_port(), free_port())
    collector: collector_proc.Running | None = None
    try:
        envoy.start(timeout_s=60)
        collector = start_collector(work)
        yield Stack(sims, envoy, collector.url)
    finally:
        if collector is not None:
            collector.stop()
        envoy.stop()
        sims.stop()


@dataclass
class World:
    plan: Plan
    route: Route
    lead: User
    pools: dict[str, Pool]


@pytest.fixture
def world(celery_worker: Any, stack: Stack, region: Region,
          make_user: Callable[..., User]) -> Iterator[Callable[..., World]]:
    """A plan whose route runs through the stack's Envoy: `build(primary=[sim pools],
    candidate=sim pool)`; `pin` puts the route, its primary and (at first) the candidate in
    the EU."""
    from fleetctl.fleet.services import pool_create

    lead = make_user("lead", "platform-lead")
    forget_shadow_state()
    eu = region_create(actor=SYSTEM, code="eu-west", name="EU West", jurisdiction="EU")

    def build(primary: list[str], candidate: str, *, pin: str = "",
              collector_url: str | None = None) -> World:
        home = eu if pin else region
        pools = {
            "primary": pool_create(actor=SYSTEM, name="h200-e2e", runtime="cuda",
                                   accelerator="H200", region=home,
                                   base_urls=[stack.sims.url(p) for p in primary],
                                   max_context_tokens=32768, node_hourly_rate="30"),
            "candidate": pool_create(actor=SYSTEM, name="mi300x-e2e", runtime="rocm",
                                     accelerator="MI300X", region=home,
                                     base_urls=[stack.sims.url(candidate)],
                                     max_context_tokens=32768, node_hourly_rate="25"),
        }
        for pool in pools.values():
            pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
            pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
        route = route_create(actor=SYSTEM, name="llama", model_id=MODEL, residency=pin,
                             primary_pool=pools["primary"], reason="test")
        gateway_create(actor=SYSTEM, name="envoy-e2e", kind="envoy",
                       admin_address=stack.envoy.admin_url,
                       options={"config_dir": str(stack.envoy.workdir),
                                "shadow_collector": collector_url or stack.collector_url},
                       routes=[route])
        pushes_verified()
        plan = plans.plan_create(actor=Actor(user=lead), name="shadow-e2e",
                                 candidate_pool=pools["candidate"],
                                 primary_pool=pools["primary"], routes=[route],
                                 slo_ttft_p95_ms=800, slo_tpot_p95_ms=60, slo_error_rate=0.01)
        return World(plan=plan, route=route, lead=lead, pools=pools)

    yield build
    forget_shadow_state()


def forget_shadow_state() -> None:
    """Runs of another test (or an earlier session: the database restarts its ids) are gone
    with its database, not from Redis: forget their routes and counters."""
    redis = live.client()
    keys = list(redis.scan_iter("fleetctl:shadow:*"))
    if keys:
        redis.delete(*keys)


def pushes_verified() -> None:
    wait_until(lambda: not GatewayPush.objects.exclude(status__in=["verified", "superseded"])
               .exists(), timeout_s=60, what="the gateway pushes to verify")
    failed = list(GatewayPush.objects.filter(status="failed").values_list("last_error", flat=True))
    assert not failed, failed


def start(w: World, collector_url: str, **options: Any) -> ShadowRun:
    run = services.run_create(actor=Actor(user=w.lead), plan=w.plan, mode="mirror",
                              route=w.route, **{"sample_percent": 100, "max_rps": 100,
                                                "min_pairs": 40, **options})
    pushes_verified()  # the gateway holds the mirror fraction

    def collector_knows() -> bool:
        seen = httpx.get(f"{collector_url}/healthz", timeout=2).json()["routes"]
        return bool(seen.get(w.route.name) == run.pk)

    wait_until(collector_knows, timeout_s=10, what="the collector to see the run")
    return run


PROMPTS = [f"Question {i}: what should I know about {topic}?"
           for i, topic in enumerate(["rivers", "bread", "orbits", "tides", "granite",
                                      "owls", "violins", "glaciers", "ferns", "copper"] * 8)]


def ask_all(stack: Stack, prompts: list[str], *, headers: dict[str, str] | None = None,
            stream_every: int = 4, max_tokens: int = 64, logprobs: bool = True) -> list[str]:
    """Each prompt once through Envoy (greedy, with logprobs unless `logprobs` is False;
    every `stream_every`-th streamed), eight at a time; the answers' texts in order. Any
    error raises. Without logprobs no flip can be told a near-tie: every replica-noise flip
    counts as divergence, on both sides."""
    client = openai.OpenAI(base_url=f"{stack.envoy.listen_url}/v1", api_key="x",
                           max_retries=0, timeout=30, default_headers=headers)

    def one(i: int) -> str:
        common: dict[str, Any] = {
            "model": MODEL, "temperature": 0, "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": prompts[i]}]}
        if logprobs:
            common.update(logprobs=True, top_logprobs=5)
        if i % stream_every == 0:
            chunks = client.chat.completions.create(**common, stream=True)
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        answer = client.chat.completions.create(**common)
        return answer.choices[0].message.content or ""

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, range(len(prompts))))


def pairs_at_least(run: ShadowRun, n: int, timeout_s: float = 60) -> None:
    wait_until(lambda: ShadowPair.objects.filter(run=run).count() >= n, timeout_s=timeout_s,
               what=f"{n} pairs of {run} (counters {live.counters(run.pk)})")


def shadowed(w: World, stack: Stack, prompts: list[str], *, logprobs: bool = True,
             **options: Any) -> tuple[ShadowRun, list[str]]:
    """Start a run, send `prompts` through Envoy, wait for their pairs, judge: the run as
    judged, and the live answers."""
    run = start(w, stack.collector_url, **options)
    answers = ask_all(stack, prompts, logprobs=logprobs)
    pairs_at_least(run, len(prompts))
    services.run_judge(run=ShadowRun.objects.get(pk=run.pk))
    run.refresh_from_db()
    return run, answers


def divergence_check(plan: Plan) -> ev.CheckResult:
    gate = ev.evaluate_gate(Plan.objects.get(pk=plan.pk), stage=2)
    return next(o.result for o in gate.outcomes if o.check.key == "divergence")


@pytest.mark.slow
def test_pairs_reach_the_plan_gate_and_a_known_divergence_rate_lies_inside_the_interval(
        world, stack):
    w = world(primary=["prim-a", "prim-b"], candidate="cand-known")

    run, _ = shadowed(w, stack, PROMPTS)

    assert run.verdict in ("pass", "warn", "fail"), run.summary
    assert run.evidence_id is not None
    evidence = Evidence.objects.get(pk=run.evidence_id)
    assert evidence.kind == "shadow" and evidence.source == f"shadow run {run.pk}"
    assert evidence.data["pairs"] >= 80 and evidence.data["run"] == run.pk
    check = divergence_check(w.plan)
    assert check.status != ev.INSUFFICIENT, check.summary
    assert check.status == {"pass": ev.PASS, "warn": ev.WARN, "fail": ev.FAIL}[run.verdict]
    # Both endpoints of the primary answered: the secondary is the other replica.
    pair = ShadowPair.objects.filter(run=run).first()
    assert pair is not None
    assert pair.sides["primary"]["endpoint"] != pair.sides["secondary"]["endpoint"]

    # The candidate flips 30 % of prompts outright; the replicas' own flips are near-ties,
    # which the gated divergence leaves to the noise floor.
    div = ShadowJudgement.objects.filter(run=run).latest("at").metrics["divergence"]
    noise = div["noise_rate"]
    assert div["n"] >= 80
    assert div["lower"] - noise <= KNOWN_RATE <= div["upper"] + noise, div
    # Informative (a confidence sequence, valid at every look: wider than one look's).
    assert div["lower"] > 0.1 and div["upper"] - div["lower"] < 0.5, div
    assert run.verdict == "fail"  # 30 points beyond a 2-point margin


@pytest.mark.slow
def test_an_aa_candidate_does_not_fail_and_a_regressed_one_does(world, stack):
    """The A/A twins carry the simulator's replica noise (5 % a server) and the requests ask
    for no logprobs, so every noise flip counts as divergence on both sides: the noise floor
    is real, and an over-eager statistic would fail the twin. Judged at every look, as a
    judge that looks all the time would, the confidence sequence never fails it."""
    w = world(primary=["prim-a", "prim-b"], candidate="cand-aa")
    same, _ = shadowed(w, stack, PROMPTS, logprobs=False)
    assert same.verdict in ("pass", "warn"), same.summary
    pairs, _ = services.judged_sequence(same)
    looks = [stats.judge_pairs(pairs[:k], margin=same.margin, min_pairs=same.min_pairs,
                               confidence=same.confidence) for k in range(1, len(pairs) + 1)]
    assert all(look.verdict != "fail" for look in looks), [look.summary for look in looks]
    div = looks[-1].metrics["divergence"]
    assert div.n == len(PROMPTS) and (div.noise_rate or 0) > 0, div  # the noise is there
    services.run_stop(actor=Actor(user=w.lead), run=same, reason="A/A done")

    pool_update(actor=SYSTEM, pool=w.pools["candidate"],
                base_urls=[stack.sims.url("cand-bad")])
    pushes_verified()
    regressed, _ = shadowed(w, stack, PROMPTS)
    assert regressed.verdict == "fail", regressed.summary
    judged = ShadowJudgement.objects.filter(run=regressed).latest("at").metrics
    assert judged["finish_mismatch"]["verdict"] == "fail", judged["finish_mismatch"]
    assert divergence_check(w.plan).status == ev.FAIL


SHADOW_TABLES = [ShadowRun, ShadowPair, ShadowJudgement]


def rows_containing(text: str) -> dict[str, int]:
    """Rows of every shadow table (and the shadow evidence) whose text, all columns
    together, contains `text`."""
    found = {}
    with connection.cursor() as cursor:
        for model in SHADOW_TABLES:
            table = model._meta.db_table
            cursor.execute(f"SELECT count(*) FROM {table} t WHERE t::text LIKE %s",
                           [f"%{text}%"])
            found[table] = cursor.fetchone()[0]
        cursor.execute(f"SELECT count(*) FROM {Evidence._meta.db_table} t "
                       f"WHERE t.kind = 'shadow' AND t::text LIKE %s", [f"%{text}%"])
        found["shadow evidence"] = cursor.fetchone()[0]
    return found


@pytest.mark.slow
def test_with_content_off_no_shadow_table_holds_any_text_of_the_requests(world, stack):
    w = world(primary=["steady-a", "steady-b"], candidate="cand-aa")
    prompts = [f"{p} My code word is {MARKER}, mail {MARKER}@example.com" for p in PROMPTS[:20]]

    run, answers = shadowed(w, stack, prompts, content="off")

    assert all(answers)
    assert not any(rows_containing(MARKER).values()), rows_containing(MARKER)
    assert not any(rows_containing("what should I know").values())
    # The search does see what is stored: the model names and the pools' endpoints are there.
    assert rows_containing(MODEL)["shadow_shadowpair"] >= 20
    assert ShadowPair.objects.filter(run=run).exclude(content={}).count() == 0


@pytest.mark.slow
def test_a_run_whose_candidate_is_outside_the_routes_pin_is_refused_and_nothing_is_mirrored(
        world, stack):
    w = world(primary=["eu-prim"], candidate="cand-aa", pin="EU")
    us = Region.objects.get(code="us-east")
    pool_update(actor=SYSTEM, pool=w.pools["candidate"], region=us)  # the candidate moved
    pushes_verified()
    unmatched_before = live.unmatched().get("llama", 0)
    api = APIClient()
    api.force_login(w.lead)

    answer = api.post("/api/v1/shadow-runs/", {"plan": "shadow-e2e", "route": "llama",
                                              "sample_percent": 100}, format="json")

    assert answer.status_code == 400, answer.json()
    assert "mi300x-e2e" in str(answer.json())
    assert not ShadowRun.objects.exists()
    route = Route.objects.get(pk=w.route.pk)
    assert (route.mirror_percent, route.mirror_pools) == (0, {})
    ask_all(stack, PROMPTS[:10], headers={"x-fleetctl-residency": "EU"})
    assert live.unmatched().get("llama", 0) == unmatched_before  # no copy left the gateway
    assert not ShadowPair.objects.exists()


@pytest.mark.slow
def test_live_answers_through_envoy_are_the_same_with_shadowing_on_and_off(world, stack):
    w = world(primary=["steady-a", "steady-b"], candidate="cand-known")
    prompts = PROMPTS[:30]
    off = ask_all(stack, prompts)
    run = start(w, stack.collector_url)

    on = ask_all(stack, prompts)

    assert on == off
    pairs_at_least(run, 30)  # and they were shadowed
    counters = selectors.live_counters(run)
    assert counters["received"] == counters["sampled"] == 30, counters
    assert counters["tokens"] > 0, counters  # all three sides' usage


@pytest.mark.slow
def test_with_the_collector_stopped_live_traffic_through_envoy_still_answers_everything(
        world, stack, tmp_path):
    collector = start_collector(tmp_path)
    try:
        w = world(primary=["steady-a", "steady-b"], candidate="cand-aa",
                  collector_url=collector.url)
        run = start(w, collector.url)
        ask_all(stack, PROMPTS[:8])
        pairs_at_least(run, 8)  # mirroring works while the collector is up
    finally:
        collector.stop()

    answers = ask_all(stack, PROMPTS[:60])  # raises on any error

    assert len(answers) == 60 and all(answers)


@pytest.mark.slow
def test_the_demo_traffic_generator_feeds_a_mirror_run_through_envoy(world, stack):
    from fleetctl.demo.traffic import Generator

    w = world(primary=["prim-a", "prim-b"], candidate="cand-aa")
    run = start(w, stack.collector_url)
    generator = Generator(stack.envoy.listen_url, 20)
    lines: list[str] = []
    # Until 40 requests left and a summary was printed, however slow the machine: a loaded
    # gateway answers later, the generator skips the slots it has no room for (not a fault).
    running = threading.Thread(target=generator.run,
                               kwargs={"out": lines.append, "summary_every_s": 1})
    running.start()
    try:
        wait_until(lambda: generator.total.sent >= 40
                   and any("demo-traffic: last" in line for line in lines),
                   timeout_s=60, what="40 requests and a summary line",
                   explain=lambda: f"{generator.total}; {lines}")
    finally:
        generator.stop.set()
        running.join(timeout=10)
    generator.close()  # after the requests in flight
    sent = generator.total

    assert sent.ok + sum(sent.failures.values()) == sent.sent
    assert sent.sent >= 40 and not sent.failures, sent
    assert sent.streamed and sent.json_mode  # its mix reaches the gateway
    assert any("demo-traffic: last" in line for line in lines), lines
    pairs_at_least(run, sent.sent)
    kinds = ShadowPair.objects.filter(run=run).values_list("params", flat=True)
    assert any(p.get("stream") for p in kinds) and any(
        p.get("response_format") == "json_object" for p in kinds), list(kinds)[:3]


@pytest.mark.slow
def test_the_demo_traffic_hangs_up_on_some_streams_and_envoy_logs_a_client_disconnect(
        world, stack):
    """`make demo` abandons one streamed request in 40, so the dashboards show client
    disconnects counted apart from the pool's errors (issue 25)."""
    from fleetctl.demo.traffic import Generator
    from fleetctl.traffic.gateways.base import ENDED_BY_CLIENT
    from fleetctl.traffic.gateways.envoy.accesslog import parse_line

    world(primary=["prim-a", "prim-b"], candidate="cand-aa")
    log = stack.envoy.access_log_path
    assert log is not None
    start_at = log.stat().st_size if log.exists() else 0
    generator = Generator(stack.envoy.listen_url, 10, stream_every=1, abandon_every=2)

    sent = generator.run(duration_s=3, out=lambda line: None)
    generator.close()

    assert sent.abandoned > 0 and sent.ok > 0 and not sent.failures, sent

    def disconnects() -> int:
        with log.open("rb") as f:
            f.seek(start_at)
            records = [parse_line(line, {}) for line in f]
        return sum(1 for r in records if r is not None and r.ended_by == ENDED_BY_CLIENT)

    assert wait_until(disconnects, what="Envoy to log the hang-ups") >= 1


def test_the_demo_traffic_rotates_over_288_distinct_prompts_and_more_distinct_requests():
    from fleetctl.demo.traffic import PROMPTS, request_body

    assert len(PROMPTS) == len(set(PROMPTS)) == 288
    # The gate counts one pair per distinct request: the demo's min_pairs (200) must be
    # reachable, at 2 requests a second within minutes.
    bodies = {json.dumps(request_body(i), sort_keys=True) for i in range(400)}
    assert len(bodies) == 400


def test_the_demo_traffic_generator_backs_off_from_a_gateway_that_does_not_answer():
    from fleetctl.demo.traffic import BACKOFF_AFTER, Generator

    generator = Generator(f"http://127.0.0.1:{free_port()}", 50, timeout_s=1)

    sent = generator.run(duration_s=2, out=lambda line: None)
    generator.close()

    failed = sum(sent.failures.values())
    # Refused at once: after BACKOFF_AFTER failures it waits 1 s, then 2 s ..., so a 2 s run
    # at 50/s sends a handful, not a hundred.
    assert BACKOFF_AFTER <= sent.sent <= 3 * BACKOFF_AFTER, sent
    assert failed == sent.sent - sent.ok and sent.ok == 0


@pytest.mark.django_db
def test_the_demo_seed_starts_one_mirror_run_for_the_mi300x_plan_and_never_a_second():
    from django.core.management import call_command

    seed = ["demo_seed", "--password=demo-pw", "--sim-base-port", "8100", "--gateway-admin",
            "http://127.0.0.1:1", "--gateway-config-dir", "/tmp/fleetctl-demo-e2e"]
    call_command(*seed, stdout=io.StringIO(), stderr=io.StringIO())
    run = ShadowRun.objects.get()
    assert (run.plan.name, run.route.name if run.route else None, run.mode, run.status) \
        == ("mi300x-llama-8b", "llama-8b", "mirror", "running")
    assert (run.sample_percent, run.max_rps, run.content, run.min_pairs) \
        == (100, 3, "redacted", 200)
    assert (run.primary.name, run.candidate.name, run.created_by) \
        == ("h200-us-east", "mi300x-us-east", "lead")
    assert run.primary.base_urls == ["http://127.0.0.1:8101", "http://127.0.0.1:8106"]
    assert Route.objects.get(name="llama-8b").mirror_percent == 100

    call_command(*seed, stdout=io.StringIO(), stderr=io.StringIO())  # a second make demo
    assert ShadowRun.objects.get() == run

    services.run_stop(actor=Actor(user=User.objects.get(username="oncall")), run=run,
                      reason="enough")
    notes = io.StringIO()
    call_command(*seed, stdout=io.StringIO(), stderr=notes)  # a stopped run stays stopped
    assert list(ShadowRun.objects.values_list("status", flat=True)) == ["stopped"]
    assert "keeps its stopped shadow run" in notes.getvalue()


@pytest.mark.django_db
def test_the_demo_seed_stores_a_prompt_trace_a_replay_run_can_start_from():
    from django.core.management import call_command

    from fleetctl.bench.models import Trace
    from fleetctl.bench.services import trace_requests
    from fleetctl.demo.traffic import PROMPTS
    from fleetctl.traffic.models import Route
    from migrations_plan.models import Plan

    seed = ["demo_seed", "--password=demo-pw", "--sim-base-port", "8100", "--gateway-admin",
            "http://127.0.0.1:1", "--gateway-config-dir", "/tmp/fleetctl-demo-e2e"]
    call_command(*seed, stdout=io.StringIO(), stderr=io.StringIO())
    trace = Trace.objects.get(name="demo-prompts")
    texts = [r.messages[0]["content"] for r in trace_requests(trace) if r.messages]
    assert texts == PROMPTS
    run = services.run_create(actor=Actor(user=User.objects.get(username="lead")),
                              plan=Plan.objects.get(name="a100-llama-8b"), mode="replay",
                              trace=trace, route=Route.objects.get(name="llama-8b"))
    assert (run.mode, run.trace, run.status) == ("replay", trace, "running")
