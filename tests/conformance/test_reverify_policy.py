"""Re-verification, through the services (the end-to-end run with Envoy is
test_reverify_e2e.py): a registry edit of the pool's fingerprint starts it as a reported
change does; a pool carrying weight on a route outside any plan is re-verified against the
route's primary; a finished re-verification probe goes on — passing: the plan's last eval
suite again (and its last benchmark where a route asks); failing: the route's
`reverify_policy` drains (as system:reverify, audited, webhook) or holds. The policy is
set on the route over REST and the dashboard, validated."""

from __future__ import annotations

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone
from rest_framework.test import APIClient

from fleetctl.audit.models import AuditEvent
from fleetctl.conformance import reverify
from fleetctl.conformance.models import ConformanceRun
from fleetctl.evals import services as evals
from fleetctl.evals.models import EvalRun
from fleetctl.fleet.models import PoolModel
from fleetctl.fleet.services import pool_model_update, pool_update
from fleetctl.traffic import services as traffic
from fleetctl.traffic.models import Drain, Route
from fleetctl.webhooks.models import Delivery
from fleetctl.webhooks.services import webhook_create
from tests.evals.test_services import upload
from tests.migrations_plan.conftest import MODEL, World, world  # noqa: F401 - the fixture

pytestmark = pytest.mark.django_db


def reverify_runs(pool) -> list[ConformanceRun]:
    return list(ConformanceRun.objects.filter(pool=pool, created_by="system:reverify"))


def finished_run(world: World, verdict: str, *, plan=None) -> ConformanceRun:  # noqa: F811
    """A re-verification probe as the worker leaves it: complete, with its verdict."""
    return ConformanceRun.objects.create(
        pool=world.candidate, primary=world.primary, plan=plan, model_id=MODEL,
        plan_stage=plan.stage if plan else None, created_by="system:reverify",
        status="complete", verdict=verdict, summary=f"{verdict}: tool calls 500")


def weight(world: World, system, share: int = 20) -> None:  # noqa: F811
    traffic.revision_create(actor=system, route=world.route, base_revision=1,
                            weights={"h200-us": 100 - share, "mi300x-us": share},
                            reason="before plans")


# --- starting -------------------------------------------------------------------------------

def test_a_registry_edit_of_the_fingerprint_starts_reverification(
        world: World, system, django_capture_on_commit_callbacks):  # noqa: F811
    plan = world.plan()
    with django_capture_on_commit_callbacks(execute=True):
        pool_update(actor=system, pool=world.candidate, runtime_version="rocm-7.0")
    runs = reverify_runs(world.candidate)
    assert [(r.plan_id, r.primary_id) for r in runs] == [(plan.pk, world.primary.pk)]
    event = AuditEvent.objects.get(action="plan.reverify", object_id=str(plan.pk))
    assert "registered runtime version rocm-6.4 → rocm-7.0" in event.message
    assert f"conformance run {runs[0].pk} started" in event.message


def test_a_registry_edit_holds_the_pools_running_ramps(
        world: World, system, django_capture_on_commit_callbacks):  # noqa: F811
    from fleetctl.ramps.services import ramp_create

    ramp = ramp_create(actor=system, route=world.route, pool=world.candidate,
                       steps=[{"percent": 10, "hold_s": 600}], slo_ttft_p95_ms=800,
                       slo_tpot_p95_ms=60, slo_error_rate=0.01)
    with django_capture_on_commit_callbacks(execute=True):
        pool_update(actor=system, pool=world.candidate, labels={"driver": "6.5.0"})
    ramp.refresh_from_db()
    assert ramp.state == "paused"
    assert "registered driver label 6.4.1 → 6.5.0" in ramp.state_reason
    assert AuditEvent.objects.filter(action="ramp.pause", actor="system:reverify").exists()


def test_a_registry_edit_of_a_models_revision_starts_it_and_other_edits_do_not(
        world: World, system, django_capture_on_commit_callbacks):  # noqa: F811
    world.plan()
    with django_capture_on_commit_callbacks(execute=True):
        pool_update(actor=system, pool=world.candidate, accelerator="MI300X-b")
    assert reverify_runs(world.candidate) == []
    entry = PoolModel.objects.get(pool=world.candidate, model_id=MODEL)
    with django_capture_on_commit_callbacks(execute=True):
        pool_model_update(actor=system, entry=entry, revision="def456")
    assert len(reverify_runs(world.candidate)) == 1
    assert AuditEvent.objects.filter(
        action="plan.reverify",
        message__contains=f"registered {MODEL} revision abc123 → def456").exists()


def test_a_pool_with_weight_outside_any_plan_is_reverified_against_the_routes_primary(
        world: World, system):  # noqa: F811
    weight(world, system)
    runs = reverify.reverify_pool(world.candidate.pk, ["server version 0.8 → 0.9"])
    assert [(r.plan, r.primary, r.model_id) for r in runs] == [(None, world.primary, MODEL)]
    assert AuditEvent.objects.filter(action="pool.reverify", object_id=str(world.candidate.pk),
                                     message__contains="weight on route llama").exists()
    # One probe per pool at a time: a second change while it runs starts nothing more.
    assert reverify.reverify_pool(world.candidate.pk, ["again"]) == []


# --- when the probe finished -------------------------------------------------------------------

def test_a_failing_probe_drains_the_pool_off_a_drain_policy_route(world: World,  # noqa: F811
                                                                  system):
    weight(world, system)
    Route.objects.filter(pk=world.route.pk).update(reverify_policy="drain")
    hook = webhook_create(actor=system, name="drains", events=["drain.automatic"],
                          url="http://127.0.0.1:9/hook")
    run = finished_run(world, "fail")
    done = reverify.after_run(run)
    drain = Drain.objects.get(pk=done["drains"][0])
    assert drain.requested_by == "system:reverify" and drain.pool == world.candidate
    assert f"conformance run {run.pk}" in drain.reason
    current = Route.objects.get(pk=world.route.pk).revisions.order_by("-number").first()
    assert current.weights.get("mi300x-us", 0) == 0
    assert AuditEvent.objects.filter(action="drain.request", actor="system:reverify").exists()
    delivery = Delivery.objects.get(webhook=hook)
    assert delivery.payload["data"]["policy"] == "reverify"
    # The same finished run looked at again does nothing twice.
    assert reverify.after_run(run) == {"evals": [], "benchmarks": [], "drains": []}


def test_a_failing_probe_on_a_hold_route_drains_nothing_and_says_so(world: World,  # noqa: F811
                                                                    system):
    weight(world, system)
    done = reverify.after_run(finished_run(world, "fail"))
    assert done["drains"] == [] and not Drain.objects.exists()
    assert AuditEvent.objects.filter(action="pool.reverify",
                                     message__contains="held on llama (policy hold").exists()


def test_a_passing_probe_runs_the_plans_last_eval_suite_again(world: World):  # noqa: F811
    plan = world.plan()
    suite, _ = upload(n=10)
    first = evals.run_create(actor=world.actor("lead"), suite=suite, plan=plan, min_items=5)
    done = reverify.after_run(finished_run(world, "pass", plan=plan))
    again = EvalRun.objects.get(pk=done["evals"][0])
    assert again.pk != first.pk and again.suite == suite and again.plan == plan
    assert again.created_by == "system:reverify" and again.min_items == 5
    assert AuditEvent.objects.filter(action="plan.reverify", object_id=str(plan.pk),
                                     message__contains=f"eval run {again.pk} started").exists()
    assert done["benchmarks"] == []  # no route asks for one


def test_a_passing_probe_reruns_the_last_benchmark_where_a_route_asks(world: World,  # noqa: F811
                                                                      system):
    from fleetctl.bench import services as bench
    from fleetctl.bench.models import Run

    plan = world.plan()
    trace = bench.trace_generate(actor=system, name="short", n=20, seed=7)
    first = bench.run_create(actor=system, trace=trace, pools=[world.candidate, world.primary],
                             model_id=MODEL, slo_ttft_p95_ms=800, slo_tpot_p95_ms=60,
                             slo_error_rate=0.01, mode="levels", levels=[1, 4])
    # The route does not ask: no benchmark.
    assert reverify.after_run(finished_run(world, "pass", plan=plan))["benchmarks"] == []
    Route.objects.filter(pk=world.route.pk).update(reverify_benchmark=True)
    done = reverify.after_run(finished_run(world, "pass", plan=plan))
    again = Run.objects.get(pk=done["benchmarks"][0])
    assert again.pk != first.pk and again.trace == trace and again.levels == [1, 4]
    assert set(again.pools.all()) == {world.candidate, world.primary}
    assert again.created_by == "system:reverify"
    # A plan whose gate has no benchmark check is not benchmarked again.
    plan.checks.filter(rule__startswith="benchmark.").update(removed_at=timezone.now())
    assert reverify.after_run(finished_run(world, "pass", plan=plan))["benchmarks"] == []


def test_a_passing_probe_without_an_eval_to_repeat_says_so(world: World):  # noqa: F811
    plan = world.plan()
    assert reverify.after_run(finished_run(world, "pass", plan=plan))["evals"] == []
    assert AuditEvent.objects.filter(action="plan.reverify",
                                     message__contains="no eval run of this plan").exists()


def test_a_probe_by_a_person_is_not_a_reverification(world: World):  # noqa: F811
    run = finished_run(world, "fail")
    ConformanceRun.objects.filter(pk=run.pk).update(created_by="olga")
    run.refresh_from_db()
    assert reverify.after_run(run) == {"evals": [], "benchmarks": [], "drains": []}


# --- the policy on the route ----------------------------------------------------------------

def test_the_policy_is_set_over_rest_and_bad_values_are_refused(world: World):  # noqa: F811
    admin = APIClient()
    admin.force_login(world.admin)
    url = f"/api/v1/routes/{world.route.name}/reverify-policy/"
    bad = admin.post(url, {"reverify_policy": "panic"}, format="json")
    assert bad.status_code == 400 and "reverify_policy" in str(bad.json())
    assert Route.objects.get(pk=world.route.pk).reverify_policy == "hold"
    done = admin.post(url, {"reverify_policy": "drain", "reverify_benchmark": True},
                      format="json")
    assert done.status_code == 200, done.json()
    assert (done.json()["reverify_policy"], done.json()["reverify_benchmark"]) == ("drain", True)
    assert AuditEvent.objects.filter(action="route.reverify_policy").exists()
    assert admin.get(f"/api/v1/routes/{world.route.name}/").json()["reverify_policy"] == "drain"
    viewer = APIClient()
    viewer.force_login(world.viewer)
    assert viewer.post(url, {"reverify_policy": "hold"}, format="json").status_code == 403
    assert Route.objects.get(pk=world.route.pk).reverify_policy == "drain"


def test_the_policy_is_set_on_the_route_page(world: World):  # noqa: F811
    client = Client()
    client.force_login(world.admin)
    page = client.get(reverse("traffic:route-detail", args=[world.route.name])).content.decode()
    assert 'id="reverify-policy"' in page and "Re-verification policy" in page
    url = reverse("traffic:route-reverify-policy", args=[world.route.name])
    client.post(url, {"reverify_policy": "nonsense"})
    assert Route.objects.get(pk=world.route.pk).reverify_policy == "hold"
    client.post(url, {"reverify_policy": "drain"})
    assert Route.objects.get(pk=world.route.pk).reverify_policy == "drain"
