"""`make demo` seeds on every start. A re-run creates what is missing and never modifies what
exists, so it keeps what people did with the demo since; it never crashes on data the API
allowed."""

from __future__ import annotations

import io

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command

from fleetctl.accounts.actor import Actor
from fleetctl.fleet import services as fleet
from fleetctl.fleet.models import Pool, PoolModel, Region
from fleetctl.traffic import services as traffic
from fleetctl.traffic.models import Gateway, Route
from migrations_plan import services as plans
from migrations_plan.models import Plan

SEED = ["demo_seed", "--password", "demo-pw", "--sim-base-port", "8100",
        "--gateway-admin", "http://127.0.0.1:1", "--gateway-config-dir", "/tmp/fleetctl-demo"]


def seed() -> str:
    """Run the seed as the demo does; what it had to say about what it kept or skipped."""
    notes = io.StringIO()
    call_command(*SEED, stdout=io.StringIO(), stderr=notes)
    return notes.getvalue()


def person(username: str) -> Actor:
    return Actor(user=User.objects.get(username=username))


def move_the_mi300x_plan_to_stage_3() -> None:
    lead2 = person("lead2")
    plan = Plan.objects.get(name="mi300x-llama-8b")
    plans.attest(actor=lead2, check=plan.checks.get(stage=2, key="dashboards"),
                 note="Grafana board and alerts exist")
    plans.approve(actor=lead2, plan=plan, justification="benchmarks come with a later issue")
    plans.advance(actor=lead2, plan=plan, reason="shadow looked fine")


@pytest.mark.django_db
def test_a_second_demo_seed_keeps_everything_people_changed_since_and_does_not_crash():
    seed()
    admin = person("admin")
    gateway = Gateway.objects.get(name="envoy-demo")
    nightly = traffic.route_create(actor=admin, name="llama-8b-nightly",
                                   model_id="llama-3.1-8b-instruct", latency_class="standard",
                                   primary_pool=Pool.objects.get(name="h200-us-east"),
                                   force=True, reason="nightly jobs get their own route")
    traffic.gateway_set_routes(actor=admin, gateway=gateway,
                               routes=[*gateway.routes.all(), nightly])
    gaudi = Pool.objects.get(name="gaudi3-in-west")
    fleet.pool_model_delete(actor=admin, entry=gaudi.models.get())
    fleet.pool_update(actor=admin, pool=gaudi, max_context_tokens=256,
                      base_urls=["http://127.0.0.1:9105"])
    move_the_mi300x_plan_to_stage_3()
    lead = User.objects.get(username="lead")
    lead.set_password("a password of my own")
    lead.save()

    notes = seed()

    assert set(Gateway.objects.get(name="envoy-demo").routes.values_list("name", flat=True)) \
        == {"llama-8b", "llama-8b-eu", "llama-8b-batch", "llama-8b-nightly"}
    gaudi.refresh_from_db()
    assert (gaudi.max_context_tokens, gaudi.base_urls) == (256, ["http://127.0.0.1:9105"])
    assert not PoolModel.objects.filter(pool=gaudi).exists()
    assert Plan.objects.get(name="mi300x-llama-8b").state == "stage-3"
    assert User.objects.get(username="lead").check_password("a password of my own")
    assert "pool gaudi3-in-west is kept as it is" in notes
    assert "user lead keeps the password it was given since" in notes


@pytest.mark.django_db
def test_the_seed_skips_a_demo_object_the_registry_refuses_says_why_and_seeds_the_rest():
    # Someone's own registry already has the TPU pool, in the US: the EU-pinned demo route
    # cannot have it as its primary (residency), which the services refuse.
    system = Actor.for_system("someone")
    us = fleet.region_create(actor=system, code="us-east", name="US East", jurisdiction="US")
    tpu = fleet.pool_create(actor=system, name="tpu-v5e-eu-west", runtime="tpu",
                            accelerator="TPU v5e", region=us,
                            base_urls=["http://127.0.0.1:9103"], max_context_tokens=8192,
                            node_hourly_rate="9.60")
    fleet.pool_model_create(actor=system, pool=tpu, model_id="llama-3.1-8b-instruct",
                            max_context_tokens=8192)

    notes = seed()

    assert "route llama-8b-eu not created: Residency: primary tpu-v5e-eu-west is in US" in notes
    assert not Route.objects.filter(name="llama-8b-eu").exists()
    assert sorted(Gateway.objects.get(name="envoy-demo").routes.values_list("name", flat=True)) \
        == ["llama-8b", "llama-8b-batch"]
    assert Plan.objects.count() == 2
    assert Region.objects.get(code="us-east").jurisdiction == "US"


@pytest.mark.django_db
def test_the_seed_gives_the_gateway_its_access_log_and_only_notes_one_seeded_before_that():
    notes = seed()

    gateway = Gateway.objects.get(name="envoy-demo")
    assert gateway.options["access_log"] == "/tmp/fleetctl-demo/access.log"
    # No simulated pool answers here: the Gaudi pool stays of unknown health, and a ramp only
    # gives live traffic to a healthy pool, so the seed says why there is no ramp.
    assert "ramp of gaudi3-in-west on llama-8b not created" in notes
    assert "healthy" in notes

    traffic.gateway_update(actor=person("admin"), gateway=gateway, options={})
    notes = seed()

    assert "access_log" not in Gateway.objects.get(name="envoy-demo").options
    assert ("gateway envoy-demo is kept as it is: it has no access_log option" in notes
            and "/tmp/fleetctl-demo/access.log" in notes)


@pytest.mark.django_db
def test_the_seed_makes_the_gateway_an_xds_one_and_keeps_its_token_where_the_demo_reads_it(
        tmp_path):
    from fleetctl.accounts.selectors import secret_hash
    from fleetctl.audit.models import AuditEvent
    from fleetctl.xds.models import XdsGateway

    token_file = tmp_path / "envoy" / "xds-token"
    with_token = [*SEED, "--gateway-token-file", str(token_file)]
    call_command(*with_token, stdout=io.StringIO(), stderr=io.StringIO())

    gateway = Gateway.objects.get(name="envoy-demo")
    assert gateway.kind == "envoy-xds" and "config_dir" not in gateway.options
    assert gateway.options["access_log"] == "/tmp/fleetctl-demo/access.log"
    token = token_file.read_text().strip()
    assert token.startswith("fxds_") and token_file.stat().st_mode & 0o777 == 0o600
    assert XdsGateway.objects.get(name="envoy-demo").token_sha256 == secret_hash(token)
    issued = AuditEvent.objects.filter(action="xds.token_issue").count()

    # A second start keeps the token that works (no rotation, nothing audited) ...
    call_command(*with_token, stdout=io.StringIO(), stderr=io.StringIO())
    assert token_file.read_text().strip() == token
    assert AuditEvent.objects.filter(action="xds.token_issue").count() == issued
    # ... and replaces one that no longer does (issued again since, or another database's).
    token_file.write_text("fxds_not-this-gateways")
    call_command(*with_token, stdout=io.StringIO(), stderr=io.StringIO())
    fresh = token_file.read_text().strip()
    assert fresh != token and fresh.startswith("fxds_")
    assert XdsGateway.objects.get(name="envoy-demo").token_sha256 == secret_hash(fresh)


@pytest.mark.django_db
def test_the_file_mode_seed_makes_an_envoy_gateway_and_an_existing_one_keeps_its_kind(
        tmp_path):
    token_file = tmp_path / "xds-token"
    token_file.write_text("left over from an xDS demo")
    notes = io.StringIO()
    call_command(*SEED, "--gateway-kind", "envoy", "--gateway-token-file", str(token_file),
                 stdout=io.StringIO(), stderr=notes)

    gateway = Gateway.objects.get(name="envoy-demo")
    assert gateway.kind == "envoy"
    assert gateway.options["config_dir"] == "/tmp/fleetctl-demo"
    assert gateway.options["access_log"] == "/tmp/fleetctl-demo/access.log"
    # No token for a gateway that is not fed over xDS: the demo then runs Envoy in file mode.
    assert not token_file.exists()

    # A data directory seeded in file mode keeps its gateway when the demo asks for xDS.
    call_command(*SEED, "--gateway-token-file", str(token_file), stdout=io.StringIO(),
                 stderr=notes)
    assert Gateway.objects.get(name="envoy-demo").kind == "envoy"
    assert not token_file.exists()
    assert "gateway envoy-demo is kept as it is: it is of kind envoy" in notes.getvalue()


@pytest.mark.django_db
def test_with_the_simulated_fleet_up_the_seed_starts_one_guarded_ramp_of_the_gaudi_pool(
        tmp_path):
    from fleetctl.demo.management.commands.demo_seed import RAMP
    from fleetctl.ramps.models import Ramp
    from tests.sim import simproc

    args = [a if a != "8100" else "{base}" for a in SEED]
    with simproc.demo_fleet(tmp_path / "sim.log") as base:
        call_command(*[a.format(base=base) for a in args], stdout=io.StringIO(),
                     stderr=io.StringIO())
        again = io.StringIO()
        call_command(*[a.format(base=base) for a in args], stdout=io.StringIO(), stderr=again)

    [ramp] = Ramp.objects.all()
    assert (ramp.route.name, ramp.pool.name, ramp.state, ramp.created_by) == (
        "llama-8b", "gaudi3-in-west", "running", "lead")
    assert [s["percent"] for s in ramp.steps] == [5, 10, 25, 50]
    assert (ramp.min_samples, ramp.window_s, ramp.slo_ttft_p95_ms) == (
        RAMP["min_samples"], RAMP["window_s"], RAMP["slo_ttft_p95_ms"])
    assert ramp.plan is None
    assert "ramp of gaudi3-in-west" not in again.getvalue()  # once: the re-run leaves it
    # The TPU takes 10 % of llama-8b before the ramp starts: short prompts may land on it.
    assert ramp.base_weights == {"h200-us-east": 9000, "tpu-v5e-eu-west": 1000}
    assert [r.weights for r in ramp.route.revisions.order_by("number")][1:] == [
        {"h200-us-east": 9000, "tpu-v5e-eu-west": 1000}]



@pytest.mark.slow
def test_the_seeds_benchmark_gives_llama_8b_a_capacity_split_one_click_applies(
        celery_worker, tmp_path, monkeypatch):
    """`make demo`'s Capacity card: the seed queues one short benchmark of the pools carrying
    llama-8b, a real worker runs it against the demo's simulated pools, its evidence gives
    the route a capacity split, and the route page's button stores it."""
    from django.test import Client
    from django.urls import reverse

    from fleetctl.bench.models import Run
    from fleetctl.demo import capacity_run
    from fleetctl.fleet.tasks import pool_probe
    from fleetctl.traffic.capacity_split import route_capacity_split
    from tests.sim import simproc
    from tests.support.waiting import wait_until

    # The demo's benchmark runs, shortened (one level of a 3 s window; the demo's three
    # levels of 10 s took two minutes here): the same code queues them and the same worker
    # runs them.
    monkeypatch.setattr(capacity_run, "LEVELS", [2])
    monkeypatch.setattr(capacity_run, "WARMUP_S", 1.0)
    monkeypatch.setattr(capacity_run, "WINDOW_S", 3.0)
    monkeypatch.setattr(capacity_run, "MIN_SAMPLES", 3)
    args = [a if a != "8100" else "{base}" for a in SEED]
    with simproc.demo_fleet(tmp_path / "sim.log") as base:
        for _ in range(2):  # the re-run leaves the run alone
            call_command(*[a.format(base=base) for a in args], stdout=io.StringIO(),
                         stderr=io.StringIO())
        [run] = Run.objects.filter(name=capacity_run.NAME)
        assert sorted(run.pools.values_list("name", flat=True)) == sorted(capacity_run.POOLS)
        wait_until(lambda: Run.objects.get(pk=run.pk).status not in Run.ACTIVE, timeout_s=300,
                   what="the seed's capacity benchmark to finish")
        for pool in Pool.objects.all():
            pool_probe(pool.pk)  # the demo's prober does this every 10 s

    run.refresh_from_db()
    assert run.status == "complete", (run.status, run.error, run.progress)
    route = Route.objects.select_related("primary_pool").get(name="llama-8b")
    split = route_capacity_split(route=route)
    assert split.refusal == "", split.refusal
    assert set(split.weights) == {"h200-us-east", "gaudi3-in-west", "tpu-v5e-eu-west"}
    left = {row.pool: row.left_out for row in split.rows}
    assert "stage" in left["mi300x-us-east"] and "stage" in left["a100-eu-central"]
    assert f"(benchmark run {run.pk} on " in split.reason

    page = Client()
    page.force_login(User.objects.get(username="oncall"))
    detail = page.get(reverse("traffic:route-detail", args=["llama-8b"]),
                      headers={"HX-Request": "true", "HX-Target": "capacity"}).content.decode()
    assert "Apply capacity split" in detail
    page.post(reverse("traffic:route-capacity-apply", args=["llama-8b"]),
              {"base_revision": str(split.revision)})
    route.refresh_from_db()
    current = route.revisions.get(number=route.revision_number)
    assert current.kind == "capacity" and current.weights == split.weights
    assert f"benchmark run {run.pk}" in current.reason and current.created_by == "oncall"
