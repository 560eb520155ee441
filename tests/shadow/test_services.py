"""Starting, adjusting and stopping shadow runs (services): every refusal names the field
and what to do and leaves nothing behind (no run, no mirror, nothing published); a start
mirrors the route and publishes the run once committed; a stop is the kill switch; the purge
empties text past retention; a replay run replays its trace on a real worker and finishes."""

from __future__ import annotations

import io
import json
from datetime import timedelta
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from fleetctl.audit.models import AuditEvent
from fleetctl.bench import services as bench
from fleetctl.core.errors import ConflictError, PermissionDeniedError
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import region_create
from fleetctl.shadow import live, services
from fleetctl.shadow.models import ShadowPair, ShadowRun
from fleetctl.traffic import services as traffic
from fleetctl.traffic.models import Route
from migrations_plan.models import Evidence, Plan
from tests.migrations_plan.conftest import MODEL, World, world  # noqa: F401 - the fixture
from tests.shadow.test_pair import (  # noqa: F401 - fixtures
    _clean_redis,
    chat,
    execute,
    shadow_sim,
    shadow_world,
)
from tests.support.waiting import wait_until


def refused(field: str, call: Any, *, says: str) -> None:
    with pytest.raises(ValidationError) as caught:
        call()
    messages = caught.value.message_dict
    assert field in messages, messages
    assert says in " ".join(messages[field]), messages[field]
    assert not ShadowRun.objects.exists()
    assert Route.objects.get(name="llama").mirror_percent == 0
    assert live.published() == {}


@pytest.fixture
def plan(world: World) -> Plan:  # noqa: F811
    return world.plan()


def create(world: World, plan: Plan, who: str = "lead", **kwargs: Any) -> ShadowRun:  # noqa: F811
    return services.run_create(actor=world.actor(who), plan=plan, **kwargs)


def haproxy(system: Any, world: World) -> None:  # noqa: F811
    """A gateway that cannot mirror, carrying the plan's route (never pushed: no commit)."""
    traffic.gateway_create(actor=system, name="haproxy-a", kind="haproxy",
                           admin_address="/tmp/haproxy-a.sock",
                           options={"bind": "127.0.0.1:1", "config_path": "/tmp/haproxy-a.cfg",
                                    "master_socket": "/tmp/haproxy-a-master.sock"},
                           routes=[world.route])


def texts_trace(system: Any, name: str = "chat-texts", n: int = 6, gap_s: float = 0.05) -> Any:
    lines = [json.dumps({"arrival_s": i * gap_s, "prompt_tokens": 6, "completion_tokens": 10,
                         "prompt": f"tell me about item {i}"}) for i in range(n)]
    return bench.trace_upload(actor=system, name=name,
                              fileobj=io.BytesIO("\n".join(lines).encode()))


# --- start ------------------------------------------------------------------------------------

def test_a_mirror_run_mirrors_its_route_and_is_published_once_committed(
        world: World, plan: Plan, django_capture_on_commit_callbacks):  # noqa: F811
    with django_capture_on_commit_callbacks(execute=True):
        run = create(world, plan, sample_percent=12.5, max_rps=3, content="off")
    assert (run.status, run.mode, run.route.name, run.model_id) == (
        "running", "mirror", "llama", MODEL)
    assert (run.candidate, run.primary) == (world.candidate, world.primary)
    assert run.margin == pytest.approx(plan.quality_margin_pct / 100) == 0.02
    assert run.gateways_without_mirror == [] and run.created_by == "bob"
    route = Route.objects.get(name="llama")
    assert (route.mirror_percent, route.mirror_owner) == (12.5, f"shadow run {run.pk}")
    assert route.mirror_pools == {"mi300x-us": world.candidate.pk, "h200-us": world.primary.pk}
    assert live.published() == {"llama": live.RunConfig(run.pk, 3.0, 2_000_000)}
    event = AuditEvent.objects.get(action="shadow.run.create")
    assert event.actor == "bob" and event.after["content"] == "off"


def test_a_route_also_carried_by_haproxy_mirrors_through_the_others_and_names_it(
        world: World, plan: Plan, system):  # noqa: F811
    haproxy(system, world)
    run = create(world, plan)
    assert run.gateways_without_mirror == ["haproxy-a"]


def test_refusals_name_the_field_and_leave_nothing(world: World, plan: Plan, system):  # noqa: F811
    other = traffic.route_create(actor=system, name="other", model_id=MODEL,
                                 latency_class="batch", primary_pool=world.primary)
    refused("route", lambda: create(world, plan, route=other),
            says="Route other is not one of plan mi300x-llama's routes (llama)")
    refused("mode", lambda: create(world, plan, mode="tee"), says="mirror")
    refused("sample_percent", lambda: create(world, plan, sample_percent=0), says="")
    refused("content", lambda: create(world, plan, content="some"), says="")
    refused("min_pairs", lambda: create(world, plan, min_pairs=3), says="")
    refused("trace", lambda: create(world, plan, mode="replay"),
            says="A replay run needs a stored trace")
    synthetic = bench.trace_generate(actor=system, name="no-texts", n=5, seed=1)
    refused("trace", lambda: create(world, plan, mode="replay", trace=synthetic),
            says="Trace no-texts carries no prompt texts")
    refused("trace", lambda: create(world, plan, trace=synthetic),
            says="A mirror run copies live requests")


def test_a_candidate_outside_the_routes_pin_is_refused(world: World, plan: Plan):  # noqa: F811
    Route.objects.filter(name="llama").update(residency="US")
    eu = region_create(actor=world.actor("admin"), code="eu-west", name="EU West",
                       jurisdiction="DE")
    Pool.objects.filter(pk=world.candidate.pk).update(region=eu)
    refused("route", lambda: create(world, plan),
            says="Residency: pool mi300x-us is in jurisdiction DE, but route llama is "
                 "pinned to US")


def test_mirroring_a_route_only_haproxy_carries_is_refused_saying_replay(
        world: World, plan: Plan, system):  # noqa: F811
    traffic.gateway_update(actor=system, gateway=world.route.gateways.get(), routes=[])
    refused("route", lambda: create(world, plan), says="carried by no gateway")
    haproxy(system, world)
    refused("mode", lambda: create(world, plan),
            says="HAProxy cannot mirror; start a replay run instead (route llama is carried "
                 "only by haproxy-a)")


def test_a_closed_plan_a_second_run_and_a_viewer_are_refused(world: World, plan: Plan):  # noqa: F811
    first = create(world, plan)
    with pytest.raises(ConflictError, match=f"Shadow run {first.pk} .* is still running"):
        create(world, plan)
    with pytest.raises(PermissionDeniedError):
        create(world, plan, who="viewer")
    assert AuditEvent.objects.filter(action="shadow.run.create", outcome="denied").exists()
    services.run_stop(actor=world.actor("oncall"), run=first, reason="done")
    Plan.objects.filter(pk=plan.pk).update(state=Plan.State.ABANDONED)
    with pytest.raises(ConflictError, match="Plan mi300x-llama is abandoned"):
        create(world, Plan.objects.get(pk=plan.pk))
    assert ShadowRun.objects.count() == 1


# --- adjust and stop --------------------------------------------------------------------------

def test_adjusting_changes_the_caps_the_collector_reads_and_the_mirrored_share(
        world: World, plan: Plan, django_capture_on_commit_callbacks):  # noqa: F811
    with django_capture_on_commit_callbacks(execute=True):
        run = create(world, plan)
    with django_capture_on_commit_callbacks(execute=True):
        run = services.run_adjust(actor=world.actor("lead"), run=run, sample_percent=25,
                                  max_rps=0.5, content="off")
    assert (run.sample_percent, run.max_rps, run.content) == (25, 0.5, "off")
    assert Route.objects.get(name="llama").mirror_percent == 25
    assert live.published()["llama"] == live.RunConfig(run.pk, 0.5, 2_000_000)
    event = AuditEvent.objects.get(action="shadow.run.adjust")
    assert (event.before["max_rps"], event.after["max_rps"]) == (2.0, 0.5)
    with pytest.raises(ValidationError) as caught:
        services.run_adjust(actor=world.actor("lead"), run=run, confidence=0.9)
    assert "confidence" in caught.value.message_dict
    with pytest.raises(ValidationError) as caught:
        services.run_adjust(actor=world.actor("lead"), run=run, max_rps=-1)
    assert "max_rps" in caught.value.message_dict
    assert ShadowRun.objects.get(pk=run.pk).max_rps == 0.5


def test_stop_is_the_kill_switch_unpublished_mirror_cleared_and_stopped(
        world: World, plan: Plan, django_capture_on_commit_callbacks):  # noqa: F811
    with django_capture_on_commit_callbacks(execute=True):
        run = create(world, plan)
    live.count(run.pk, received=5, sampled=3, pairs=3)
    with pytest.raises(ValidationError):
        services.run_stop(actor=world.actor("oncall"), run=run, reason=" ")
    with django_capture_on_commit_callbacks(execute=True):
        stopped = services.run_stop(actor=world.actor("oncall"), run=run,
                                    reason="candidate answers look wrong")
    assert (stopped.status, stopped.cancelled_by, stopped.stop_reason) == (
        "stopped", "olga", "candidate answers look wrong")
    assert stopped.counters["received"] == 5 and stopped.counters["pairs"] == 3
    assert live.published() == {}
    route = Route.objects.get(name="llama")
    assert (route.mirror_percent, route.mirror_owner) == (0, "")
    with pytest.raises(ConflictError, match="is stopped already"):
        services.run_stop(actor=world.actor("oncall"), run=run, reason="again")
    with pytest.raises(ConflictError, match="only a running run can be adjusted"):
        services.run_adjust(actor=world.actor("lead"), run=run, max_rps=1)


def test_stopping_leaves_another_runs_publication_alone(world: World, plan: Plan):  # noqa: F811
    run = create(world, plan)
    live.publish_run(run.pk + 1000, "llama", max_rps=1, max_tokens_per_day=1000)
    services.run_stop(actor=world.actor("oncall"), run=run, reason="done")
    assert live.published()["llama"].run == run.pk + 1000


def test_the_beat_publishes_a_running_run_redis_forgot_and_takes_down_a_stale_one(
        world: World, plan: Plan):  # noqa: F811
    run = create(world, plan, max_rps=3)
    live.count(run.pk, received=7, sampled=5, pairs=4)
    services.runs_judge()  # folds the counters into the row
    live.client().delete(live.ROUTES_KEY, live.counters_key(run.pk))  # Redis restarted empty
    live.publish_run(run.pk + 1000, "other-route", max_rps=1, max_tokens_per_day=1000)
    services.runs_judge()
    assert live.published() == {"llama": live.RunConfig(run.pk, 3.0, run.max_tokens_per_day)}
    live.count(run.pk, received=1)  # counting goes on from where it was, not from 0
    assert {k: v for k, v in live.counters(run.pk).items() if v} == {
        "received": 8, "sampled": 5, "pairs": 4}


# --- judge and purge --------------------------------------------------------------------------

def test_the_beat_judges_running_runs_only(world: World, plan: Plan):  # noqa: F811
    run = create(world, plan)
    assert services.runs_judge() == 1
    services.run_stop(actor=world.actor("oncall"), run=run, reason="done")
    assert services.runs_judge() == 0
    run.refresh_from_db()
    assert (run.verdict, run.judgements.count()) == ("insufficient", 1)
    assert run.summary == "no pairs compared yet (need 200): insufficient (margin 2 pts)"
    assert run.evidence_id is None  # nothing measured, nothing recorded


def test_the_purge_empties_text_past_retention_and_keeps_the_metrics(
        shadow_world: World):  # noqa: F811
    run = services.run_create(actor=shadow_world.actor("lead"), plan=shadow_world.plan(),
                              content="full", retention_hours=2)
    old, recent = (execute(run, chat(i, max_tokens=20)) for i in (1, 2))
    assert old is not None and recent is not None
    now = timezone.now()
    ShadowPair.objects.filter(pk=old.pk).update(received_at=now - timedelta(hours=3),
                                                signal={**old.signal, "token_a": "x"})
    ShadowPair.objects.filter(pk=recent.pk).update(received_at=now - timedelta(hours=1))
    assert services.pairs_purge(now) == 1
    old.refresh_from_db()
    recent.refresh_from_db()
    assert (old.content, old.content_purged_at) == ({}, now)
    assert "token_a" not in old.signal and old.signal["exact_match"] == 1
    assert old.sides["primary"]["text_sha256"]
    assert recent.content["primary"] and recent.content_purged_at is None
    assert services.pairs_purge(now) == 0


# --- replay -----------------------------------------------------------------------------------

def test_a_replay_run_replays_the_traces_texts_and_finishes_judged(
        celery_worker, shadow_world: World, system):  # noqa: F811
    trace = texts_trace(system)
    plan = shadow_world.plan()
    run = services.run_create(actor=shadow_world.actor("lead"), plan=plan, mode="replay",
                              trace=trace, sample_percent=100, max_rps=50, min_pairs=10)
    assert Route.objects.get(name="llama").mirror_percent == 0  # a replay mirrors nothing
    done = wait_until(lambda: ShadowRun.objects.filter(pk=run.pk).exclude(
        status="running").first(), timeout_s=90, what="the replay to finish")
    assert done.status == "complete", done.stop_reason
    assert done.stop_reason == "the trace was replayed (6 of 6 requests sampled)"
    pairs = list(ShadowPair.objects.filter(run=run))
    assert len(pairs) == 6 and {p.source for p in pairs} == {"replay"}
    for pair in pairs:
        assert pair.params["max_tokens"] == 10 and pair.greedy and pair.params["stream"]
        assert pair.sides["candidate"]["completion_tokens"] == 10
    assert (done.counters["received"], done.counters["sampled"], done.counters["pairs"]) == (
        6, 6, 6)
    assert done.verdict == "insufficient" and done.judged_at is not None
    evidence = Evidence.objects.get(pk=done.evidence_id)
    assert (evidence.kind, evidence.verdict, evidence.source) == (
        "shadow", "info", f"shadow run {run.pk}")
    assert evidence.data["pairs"] == 6 and evidence.data["mode"] == "replay"
