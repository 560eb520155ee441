"""The routing probe (issue 28, "routing policy holds"), all real: simulated pools, a real
Envoy pushed by a real Celery worker, the probe run by that worker through the gateway's
listener. A gateway that routes as the policy says passes (and the stage-4 check reads the
evidence); one holding a config that sends long prompts to a small pool, or pinned requests
abroad, fails, naming the request; bad input is a 400."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from fleetctl.accounts.actor import Actor
from fleetctl.conformance import routing_services
from fleetctl.conformance.models import RoutingProbe
from fleetctl.core.ports import free_port
from fleetctl.demo.envoy_process import EnvoyProcess
from fleetctl.fleet import services as fleet
from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.traffic import selectors
from fleetctl.traffic import services as traffic
from fleetctl.traffic.gateways.registry import adapter_for
from fleetctl.traffic.models import Gateway, GatewayPush
from migrations_plan import evidence as ev
from migrations_plan.models import Evidence
from migrations_plan.services import plan_create
from tests.sim.simproc import SimProcess, sim_with_profiles
from tests.support.profiles import TEST_PROFILES
from tests.support.waiting import wait_until

pytestmark = pytest.mark.slow
MODEL = "llama-3.1-8b-instruct"
POOLS = ("rp-small", "rp-big", "rp-eu", "rp-eu-big")
TIERS = [{"max_prompt_tokens": 8192, "behaviour": "failover"},
         {"max_prompt_tokens": 32768, "behaviour": "pinned"},
         {"behaviour": "reject"}]


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimProcess]:
    sim = sim_with_profiles(tmp_path_factory.mktemp("routing-sims"), TEST_PROFILES,
                            dict.fromkeys(POOLS, "quick"), models=[MODEL])
    yield sim
    sim.stop()


@pytest.fixture
def envoy(tmp_path: Path) -> Iterator[EnvoyProcess]:
    process = EnvoyProcess(tmp_path / "envoy", free_port(), free_port()).start(timeout_s=60)
    yield process
    process.stop()


def _settled() -> None:
    wait_until(lambda: not GatewayPush.objects.filter(status__in=["pending", "retrying"])
               .exists(), timeout_s=60, what="pushes to verify")


@pytest.fixture
def world(celery_worker: Any, sims: SimProcess, envoy: EnvoyProcess, make_pool: Any,
          make_user: Any, system: Actor) -> SimpleNamespace:
    """`chat` (US, unpinned: small 8k and big 32k, tiers 8k / 32k / reject) and `chat-eu`
    (pinned to EU, on rp-eu-big), both on one Envoy; a plan whose candidate is rp-eu."""
    eu = fleet.region_create(actor=system, code="eu-west", name="EU West", jurisdiction="EU")
    pools = {}
    for name, context, region in (("rp-small", 8192, None), ("rp-big", 32768, None),
                                  ("rp-eu", 32768, eu), ("rp-eu-big", 32768, eu)):
        extra = {"region": region} if region is not None else {}
        pools[name] = make_pool(name=name, base_urls=[sims.url(name)], **extra)
        pool_model_create(actor=system, pool=pools[name], model_id=MODEL,
                          max_context_tokens=context)
        pool_health_record(pool_id=pools[name].pk, ok=True, status_code=200, latency_ms=1.0)
    chat = traffic.route_create(actor=system, name="chat", model_id=MODEL,
                                primary_pool=pools["rp-big"],
                                weights={"rp-small": 50, "rp-big": 50}, reason="test")
    chat_eu = traffic.route_create(actor=system, name="chat-eu", model_id=MODEL,
                                   primary_pool=pools["rp-eu-big"], residency="EU",
                                   reason="test")
    traffic.route_tiers_set(actor=system, route=chat, tiers=TIERS)
    traffic.route_tiers_set(actor=system, route=chat_eu, tiers=TIERS[1:])
    gateway = traffic.gateway_create(
        actor=system, name="envoy-rp", kind="envoy", admin_address=envoy.admin_url,
        options={"config_dir": str(envoy.workdir), "listen_url": envoy.listen_url},
        routes=[chat, chat_eu])
    _settled()
    lead = Actor(user=make_user("lead", "platform-lead"))
    plan = plan_create(actor=lead, name="eu-cand", candidate_pool=pools["rp-eu"],
                       primary_pool=pools["rp-big"], routes=[chat], slo_ttft_p95_ms=800,
                       slo_tpot_p95_ms=60, slo_error_rate=0.01)
    return SimpleNamespace(chat=chat, chat_eu=chat_eu, gateway=gateway, lead=lead, plan=plan,
                           pools=pools)


def _run(world: SimpleNamespace, route: Any, plan: Any = None) -> RoutingProbe:
    probe = routing_services.probe_create(actor=world.lead, route=route, plan=plan)
    return wait_until(lambda: RoutingProbe.objects.filter(
        pk=probe.pk, status__in=["complete", "failed"]).first(), timeout_s=90,
        what=f"routing probe {probe.pk} to finish")


def _by_label(probe: RoutingProbe) -> dict[str, dict[str, Any]]:
    return {r["label"].split(" (")[0]: r for r in probe.results}


def _stage4(plan: Any) -> ev.CheckResult:
    outcome = next(o for o in ev.evaluate_gate(plan, stage=4).outcomes
                   if o.check.key == "routing-policy")
    return outcome.result


def test_a_gateway_that_routes_by_the_policy_passes_and_becomes_stage_4_evidence(
        world: SimpleNamespace) -> None:
    assert _stage4(world.plan).status == ev.INSUFFICIENT
    probe = _run(world, world.chat, world.plan)
    assert probe.status == "complete", probe.error
    assert probe.verdict == "pass", probe.summary
    seen = _by_label(probe)
    assert seen["tier 0 short"]["pool"] in {"rp-small", "rp-big"}
    assert seen["tier 0 long"]["stated"] == 8192
    # The long prompts of the 32k tier land on the high-memory pool only; above the last
    # bound, and a prompt of unknown size (the last tier), the gateway itself answers 413.
    assert seen["tier 1 short"]["pool"] == seen["tier 1 long"]["pool"] == "rp-big"
    assert seen["tier 1 long"]["routed_tokens"] == "32768"
    for label in ("tier 2 short", "tier 2 long", "unknown size"):
        assert (seen[label]["status"], seen[label]["pool"]) == (413, ""), seen[label]
    assert {r["result"] for r in probe.results} == {"ok"}
    row = Evidence.objects.get(kind="routing-policy", route=world.chat)
    assert (row.pool.name, row.verdict) == ("rp-eu", "pass")
    assert row.data["violations"] == [] and row.data["requests"] == 7
    result = _stage4(world.plan)
    assert result.status == ev.PASS, result.summary


def test_a_pinned_route_stays_in_its_jurisdiction(world: SimpleNamespace) -> None:
    probe = _run(world, world.chat_eu)
    assert probe.verdict == "pass", probe.summary
    assert {r["pool"] for r in probe.results if r["pool"]} == {"rp-eu-big"}
    assert not Evidence.objects.filter(kind="routing-policy").exists()  # no plan: no evidence


def test_a_gateway_sending_long_prompts_to_a_small_pool_or_abroad_fails(
        world: SimpleNamespace, envoy: EnvoyProcess) -> None:
    """The gateway holds a config fleetctl would never push (as a stale or hand-edited one
    would be): tier 1 of `chat` lists the 8k pool, `chat-eu` the US pool. The probe reads
    the answers' pool header and says which request broke which rule."""
    desired = selectors.gateway_desired_state(gateway=world.gateway)
    bad = []
    for spec in desired.routes:
        if spec.key == "chat":
            tiers = (spec.tiers[0], replace(spec.tiers[1], pools=("rp-small",)),
                     *spec.tiers[2:])
            bad.append(replace(spec, weights={"rp-small": 5000, "rp-big": 5000}, tiers=tiers))
        else:
            bad.append(replace(spec, weights={"rp-big": 10000},
                               tiers=tuple(replace(t, pools=("rp-big",)) for t in spec.tiers)))
    spec = selectors.gateway_spec(Gateway.objects.get(pk=world.gateway.pk))
    adapter_for(spec).apply(replace(desired, routes=tuple(bad)))

    probe = _run(world, world.chat, world.plan)
    assert probe.verdict == "fail", probe.summary
    seen = _by_label(probe)
    assert seen["tier 1 long"]["pool"] == "rp-small"
    assert seen["tier 1 long"]["result"] == "violation"
    assert "rp-small, which may not serve it (context too small" in seen["tier 1 long"]["detail"]
    assert "tier 1 long" in probe.summary
    assert _stage4(world.plan).status == ev.FAIL

    pinned = _run(world, world.chat_eu)
    assert pinned.verdict == "fail", pinned.summary
    assert all(r["result"] == "violation" for r in pinned.results if r["pool"])
    assert "the route is pinned to EU" in pinned.results[0]["detail"]


def test_bad_input_is_a_400_and_a_second_probe_a_409(
        world: SimpleNamespace, token_client: Any, system: Actor) -> None:
    client = token_client(["read", "jobs"], "platform-lead")
    answer = client.post("/api/v1/routing-probes/", {"route": "nope"}, format="json")
    assert answer.status_code == 400
    assert "No route named nope" in answer.json()["error"]["message"]
    answer = client.post("/api/v1/routing-probes/", {"route": "chat-eu", "plan": "eu-cand"},
                         format="json")
    assert answer.status_code == 400
    assert "not one of plan eu-cand's routes" in answer.json()["error"]["message"]
    busy = RoutingProbe.objects.create(route=world.chat, status="running", created_by="t")
    answer = client.post("/api/v1/routing-probes/", {"route": "chat"}, format="json")
    assert answer.status_code == 409
    assert f"Routing probe {busy.pk} of chat is still running" in answer.json()["error"][
        "message"]
    busy.delete()
    traffic.gateway_update(actor=system, gateway=world.gateway,
                           options={"config_dir": world.gateway.options["config_dir"]})
    answer = client.post("/api/v1/routing-probes/", {"route": "chat"}, format="json")
    assert answer.status_code == 400
    assert "Set the gateway's listen_url option" in answer.json()["error"]["message"]
    assert not RoutingProbe.objects.exists()


def test_the_stage_4_gate_has_the_button_and_the_probe_page_shows_each_request(
        world: SimpleNamespace, make_user: Any) -> None:
    from django.test import Client
    from django.urls import reverse

    client = Client()
    client.force_login(world.lead.user)
    page = client.get(reverse("plans:detail", args=["eu-cand"]) + "?stage=4").content.decode()
    assert "Routing policy holds through the gateway" in page
    assert "Probe the routing policy" in page
    done = client.post(reverse("conformance:plan-routing-probe", args=["eu-cand"]),
                       follow=True)
    probe = RoutingProbe.objects.get(route=world.chat)
    assert f"Started routing probe {probe.pk} of chat." in done.content.decode()
    wait_until(lambda: RoutingProbe.objects.filter(pk=probe.pk, status="complete").exists(),
               timeout_s=90, what="the probe to finish")
    html = client.get(reverse("conformance:routing-probe-detail", args=[probe.pk])
                      ).content.decode()
    assert "tier 1 long (32,768 tokens)" in html, html[-3000:]
    assert "the gateway's 413" in html
    viewer = Client()
    viewer.force_login(make_user("vic", "viewer"))
    assert "Probe the routing policy" not in viewer.get(
        reverse("plans:detail", args=["eu-cand"]) + "?stage=4").content.decode()
    viewer.post(reverse("conformance:plan-routing-probe", args=["eu-cand"]))
    assert RoutingProbe.objects.count() == 1


def test_the_cli_starts_a_probe_waits_and_exits_3_on_a_violation(
        world: SimpleNamespace, live_server: Any, make_user: Any) -> None:
    from fleetctl.accounts.services import token_create_personal
    from tests.cli.test_cli import run

    token = token_create_personal(actor=Actor(user=make_user("olga", "on-call")), name="cli",
                                  scopes=["read", "jobs"]).secret
    done = run(live_server, "conformance", "routing-probe", "chat-eu", "--wait", token=token,
               timeout_s=120)
    assert done.returncode == 0, done.stderr
    assert "started routing probe" in done.stderr
    assert "pass" in done.stdout and "rp-eu-big" in done.stdout
    unknown = run(live_server, "conformance", "routing-probe", "nope", token=token)
    assert unknown.returncode == 1 and "No route named nope" in unknown.stderr


@pytest.mark.django_db
def test_migration_0012_adds_the_check_to_open_plans_once(make_pool: Any, make_user: Any,
                                                          system: Actor) -> None:
    import importlib

    from django.apps import apps as django_apps

    pools = [make_pool(name=name) for name in ("m-primary", "m-cand")]
    for pool in pools:
        pool_model_create(actor=system, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    route = traffic.route_create(actor=system, name="m-chat", model_id=MODEL,
                                 primary_pool=pools[0])
    plan = plan_create(actor=Actor(user=make_user("lea", "platform-lead")), name="m-plan",
                       candidate_pool=pools[1], primary_pool=pools[0], routes=[route],
                       slo_ttft_p95_ms=800, slo_tpot_p95_ms=60, slo_error_rate=0.01)
    check = plan.checks.get(stage=4, key="routing-policy")
    assert (check.rule, check.params) == ("routing.policy_holds", {"within_days": 7})
    migration = importlib.import_module(
        "migrations_plan.migrations.0012_routing_policy_check")
    plan.checks.filter(key="routing-policy").delete()  # as before 0012
    migration.forwards(django_apps, None)
    migration.forwards(django_apps, None)
    added = plan.checks.filter(stage=4, key="routing-policy", removed_at__isnull=True)
    assert added.count() == 1 and added.get().rule == "routing.policy_holds"
    migration.backwards(django_apps, None)
    assert not plan.checks.filter(key="routing-policy").exists()
