"""Generated requests (schemathesis) against the app's own OpenAPI schema, in-process through
Django's WSGI app and the test database, with a token that holds every scope: no answer is a
5xx, every status is one the operation documents, and every answer matches its schema. Every
operation, reads and writes (POST, PUT, PATCH, DELETE), runs with generated parameters and
bodies, valid and invalid; every operation that takes an id also runs with ids of the wrong
type and with ids of real rows (deletes of real rows last, so the rest have rows to act on)."""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from datetime import date
from decimal import Decimal
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from django.contrib.auth.models import User
from django.core.signals import request_finished, request_started
from django.db import close_old_connections, transaction
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import token_create_personal, token_create_service
from fleetctl.audit.models import AuditEvent
from fleetctl.bench import services as bench
from fleetctl.conformance import routing_services
from fleetctl.conformance import services as conformance
from fleetctl.evals import services as evals
from fleetctl.evals.models import EvalRun
from fleetctl.fleet.models import Pool
from fleetctl.fleet.services import currency_rate_create, pool_health_record, pool_model_create
from fleetctl.shadow import services as shadow_services
from fleetctl.traffic import services as traffic
from fleetctl.traffic.models import Route
from fleetctl.wsgi import application
from migrations_plan import services as plans
from tests.evals.test_api import scored_run, suite_text
from tests.shadow.test_api import _pair as _shadow_pair

pytestmark = [pytest.mark.django_db, pytest.mark.slow]

MODEL = "llama-3.1-8b-instruct"
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance]
# Per operation and mode; with derandomize the cases are the same on every run.
EXAMPLES = 6
# {name} and {id} mean a different table under each collection.
NAMED = {"pools": "pool", "routes": "route", "gateways": "gateway", "traces": "trace",
         "plans": "plan", "webhooks": "webhook", "metric-sources": "metric_source"}
NUMBERED = {"pool-models": "pool_model", "health-checks": "health_check",
            "health-transitions": "health_transition", "audit-events": "audit_event",
            "pushes": "push", "drains": "drain", "evidence": "evidence", "runs": "run",
            "tokens": "token", "service-tokens": "service_token",
            "conformance-runs": "conformance_run", "currency-rates": "currency_rate",
            "shadow-runs": "shadow_run", "eval-suites": "eval_suite",
            "eval-runs": "eval_run", "ramps": "ramp", "jobs": "batch_job",
            "files": "batch_file", "soaks": "soak", "schedules": "schedule",
            "watches": "watch", "routing-probes": "routing_probe"}


def _healthy(pool: Pool) -> Pool:
    pool_model_create(actor=Actor.for_system("test"), pool=pool, model_id=MODEL,
                      revision="abc123", max_context_tokens=8192)
    for _ in range(2):
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    return Pool.objects.get(pk=pool.pk)


@pytest.fixture
def rows(make_pool: Callable[..., Pool], make_user: Callable[..., User], system: Actor,
         tmp_path: Path, monkeypatch: pytest.MonkeyPatch, settings: Any) -> dict[str, Any]:
    """One of everything the API shows, made through the services."""
    from fleetctl.ramps.services import ramp_create
    from fleetctl.traffic.api import waiting
    from fleetctl.webhooks.services import webhook_create

    # No worker pushes here: a ?wait=verified answer would only sit out its timeout.
    monkeypatch.setattr(waiting, "CAP_S", 0.2)
    primary, candidate, spare = (_healthy(make_pool(name=n))
                                 for n in ("h200", "mi300x", "a100"))
    route = traffic.route_create(actor=system, name="llama", model_id=MODEL,
                                 primary_pool=primary)
    gateway = traffic.gateway_create(actor=system, name="envoy-a", kind="envoy",
                                     admin_address="http://127.0.0.1:1",
                                     options={"config_dir": str(tmp_path),
                                              "listen_url": "http://127.0.0.1:2"},
                                     routes=[route])
    traffic.revision_create(actor=system, route=route, weights={"h200": 90, "a100": 10},
                            base_revision=route.revision_number, reason="canary")
    drain = traffic.drain_request(actor=system, route=Route.objects.get(pk=route.pk),
                                  reason="p95 regression")
    author = make_user("alice", "platform-lead")
    plan = plans.plan_create(actor=Actor(user=author), name="mi300x-llama",
                             candidate_pool=candidate, primary_pool=primary, routes=[route],
                             slo_ttft_p95_ms=800, slo_tpot_p95_ms=60, slo_error_rate=0.01)
    # A kind with no data schema (the conformance kind's needs a probe run's cases).
    evidence = plans.evidence_record(actor=system, pool=candidate, kind="eval",
                                     verdict="pass", summary="412/420 eval cases")
    ramp = ramp_create(actor=system, route=Route.objects.get(pk=route.pk), pool=spare,
                       steps=[{"percent": 5, "hold_s": 60}, {"percent": 20, "hold_s": 60}],
                       slo_ttft_p95_ms=800, slo_tpot_p95_ms=60, slo_error_rate=0.01,
                       reason="canary")
    watch = _watch_row(route, primary)
    hook = webhook_create(actor=system, name="ops-hook", url="http://127.0.0.1:9/hook",
                          events=["ramp.decision"])
    rate = currency_rate_create(actor=system, from_currency="EUR", to_currency="USD",
                                rate=Decimal("1.08"), as_of=date(2026, 11, 30), source="ECB")
    probe = conformance.run_create(actor=system, pool=candidate, plan=plan)
    routing_probe = routing_services.probe_create(actor=system, route=route, plan=plan)
    shadow = shadow_services.run_create(actor=system, plan=plan, min_pairs=10)
    _shadow_pair(shadow, 1, content={"prompt": "hi", "primary": "hello"})  # no pools run here
    shadow_services.run_judge(run=shadow)
    suite, _ = evals.suite_upload(actor=system, name="sums",
                                  fileobj=io.BytesIO(suite_text().encode()))
    # Scored here, finished as the runner would (no worker): a diff, statistics, evidence.
    eval_run = evals.run_create(actor=system, suite=suite, plan=plan, min_items=2)
    EvalRun.objects.filter(pk=eval_run.pk).update(status="running")
    evals.run_finish(scored_run(eval_run, candidate.name, primary.name))
    trace = bench.trace_generate(actor=system, name="short-chat", n=20, seed=7)
    run = bench.run_create(actor=system, trace=trace, pools=[primary], model_id=MODEL,
                           slo_ttft_p95_ms=800, slo_tpot_p95_ms=60, slo_error_rate=0.01)
    admin = make_user("ada", "admin")
    batch_job, soak = _batch_rows(system, primary, gateway, make_pool, make_user, admin,
                                  tmp_path, settings)
    from fleetctl.schedules.services import schedule_create

    schedule = schedule_create(actor=system, kind="conformance", plan=plan, cron="0 3 * * 6",
                               window_minutes=60)
    from fleetctl.prometheus.services import source_create

    source = source_create(actor=Actor(user=admin), name="prom", base_url="http://127.0.0.1:9")
    issued = token_create_personal(actor=Actor(user=admin), name="fuzz",
                                   scopes=["read", "jobs", "ramp", "drain", "fleet"])
    bot = token_create_service(actor=system, name="ci-bot", scopes=["read"])
    # For the operation that revokes the token it is called with.
    disposable = token_create_personal(actor=Actor(user=admin), name="revoked-by-itself",
                                       scopes=["read"])
    return {
        "code": primary.region.code, "pool": primary.name, "route": route.name,
        "spare": spare.name, "ramp": ramp.pk, "watch": watch.pk, "webhook": hook.name,
        "metric_source": source.name,
        "gateway": gateway.name, "trace": trace.name, "plan": plan.name, "stage": 1,
        "check_id": plan.checks.first().pk,
        "pool_model": primary.models.first().pk,
        "health_check": primary.health_checks.first().pk,
        "health_transition": primary.health_transitions.first().pk,
        "audit_event": AuditEvent.objects.first().pk,
        "push": gateway.pushes.first().pk,
        "drain": drain.pk, "evidence": evidence.pk, "run": run.pk, "token": issued.token.pk,
        "service_token": bot.token.pk, "conformance_run": probe.pk, "currency_rate": rate.pk,
        "shadow_run": shadow.pk, "eval_suite": suite.pk, "eval_run": eval_run.pk,
        "batch_job": batch_job.pk, "batch_file": batch_job.input_file_id, "soak": soak.pk,
        "schedule": schedule.pk, "routing_probe": routing_probe.pk,
        "authorization": f"Bearer {issued.secret}", "username": admin.username,
        "disposable_authorization": f"Bearer {disposable.secret}",
        "admin": admin,
    }


def _watch_row(route: Any, pool: Pool) -> Any:
    """A standing watch of the primary (as a completed ramp hands over) with one verdict."""
    from datetime import timedelta

    from django.utils import timezone

    from fleetctl.ramps.models import Watch, WatchVerdict

    watch = Watch.objects.create(route=route, pool=pool, role="primary", policy="alert",
                                 created_by="system:ramp-guard", slo_ttft_p95_ms=800,
                                 slo_tpot_p95_ms=60, slo_error_rate=0.01,
                                 latency_margin_pct=10)
    end = timezone.now()
    WatchVerdict.objects.create(watch=watch, window_start=end - timedelta(seconds=30),
                                window_end=end, verdict="pass", requests=120,
                                ttft_p95_ms=210.0, error_rate=0.0, summary="pass: held")
    return watch


class _People:
    """What tests/migrations_plan/helpers.walk_to needs: people by role name."""

    def __init__(self, **users: User) -> None:
        self.users = users

    def actor(self, name: str) -> Actor:
        return Actor(user=self.users[name])


def _batch_rows(system: Actor, primary: Pool, gateway: Any, make_pool: Callable[..., Pool],
                make_user: Callable[..., User], admin: User, tmp_path: Path,
                settings: Any) -> tuple[Any, Any]:
    """A batch job on the primary (a plan's primary runs batch jobs at any stage), and a soak
    of a second plan walked to stage 3 on a batch-class route (no worker runs either)."""
    from fleetctl.batch.soak import soak_create
    from tests.batch.factory import make_job, upload, write_input
    from tests.migrations_plan.helpers import walk_to

    settings.BATCH_FILES_DIR = tmp_path / "batch-files"
    job = make_job(system, primary, n=3, tmp_path=tmp_path)
    l40s = _healthy(make_pool(name="l40s"))
    nightly = traffic.route_create(actor=system, name="llama-nightly", model_id=MODEL,
                                   latency_class="batch", primary_pool=primary)
    traffic.gateway_set_routes(actor=system, gateway=gateway,
                               routes=[*gateway.routes.all(), nightly])
    people = _People(author=make_user("nina", "platform-lead"),
                     lead=make_user("bob", "platform-lead"),
                     oncall=make_user("olga", "on-call"), admin=admin)
    plan = plans.plan_create(actor=people.actor("author"), name="l40s-nightly",
                             candidate_pool=l40s, primary_pool=primary, routes=[nightly],
                             slo_ttft_p95_ms=800, slo_tpot_p95_ms=60, slo_error_rate=0.01)
    plan = walk_to(people, plan, 3)
    soak = soak_create(actor=people.actor("lead"), plan=plan, every_s=60, duration_s=600,
                       input_file=upload(system, write_input(tmp_path / "soak.jsonl", 3)))
    return job, soak


def _real_path_parameters(path: str, rows: dict[str, Any]) -> dict[str, Any]:
    """Ids of real rows for a path template such as /api/v1/plans/{name}/gates/{stage}/."""
    parts = path.strip("/").split("/")
    values: dict[str, Any] = {}
    for before, part in pairwise(parts):
        if part == "{name}":
            values["name"] = rows[NAMED[before]]
        elif part == "{id}":
            assert before in NUMBERED, f"add a row of {before} to the rows fixture"
            values["id"] = rows[NUMBERED[before]]
        elif part in ("{code}", "{stage}", "{check_id}", "{username}"):
            values[part.strip("{}")] = rows[part.strip("{}")]
    return values


def _exercise(operation: Any, mode: GenerationMode, headers: dict[str, str],
              path_parameters: dict[str, Any] | None, statuses: list[int]) -> None:
    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode, path_parameters=path_parameters))
    def run(case: Any) -> None:
        # A savepoint per request, as each would have its own transaction in a server: a
        # statement PostgreSQL refused must not abort the test's transaction for the next.
        # Marked like the test case's own blocks: it stands for the server's outermost level,
        # where the push engine may talk to gateways (a drain's first push).
        savepoint = transaction.atomic()
        savepoint._from_testcase = True  # type: ignore[attr-defined]
        with savepoint:
            statuses.append(case.call_and_validate(headers=headers, checks=CHECKS).status_code)

    run()


@pytest.fixture
def in_test_transaction() -> Iterator[None]:
    """Django's WSGI handler closes the database connection after each request; in-process
    that is the test's own connection (and transaction). Django's test client keeps it the
    same way."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def unthrottled() -> Iterator[None]:
    """In-process requests have no client address ("unknown"): invalid tokens counted against
    it in Redis must neither block this test from the start nor outlive it."""
    from fleetctl.accounts import throttle

    throttle.reset("unknown")
    yield
    throttle.reset("unknown")


# Operations that revoke the credentials they are called with: last, with a token of their own.
SELF_REVOKING = {("DELETE", "/api/v1/tokens/current/")}


def test_generated_requests_get_no_server_error_and_answers_match_the_schema(
        rows, in_test_transaction, unthrottled):
    schema = schemathesis.openapi.from_wsgi("/api/schema/", application)
    # identity: the in-process client would not undo the GZip middleware's compression.
    headers = {"Authorization": rows["authorization"], "Accept-Encoding": "identity"}
    failures: list[str] = []
    tried = 0
    runs: list[tuple[Any, GenerationMode, dict[str, Any] | None]] = []
    deletes: list[tuple[Any, GenerationMode, dict[str, Any] | None]] = []
    last: list[tuple[Any, GenerationMode, dict[str, Any] | None]] = []
    methods: set[str] = set()
    for result in schema.get_all_operations():
        operation = result.ok()
        methods.add(operation.method.upper())
        if (operation.method.upper(), operation.path) in SELF_REVOKING:
            last += [(operation, GenerationMode.POSITIVE, None),
                     (operation, GenerationMode.NEGATIVE, None)]
            continue
        takes_id = "{" in operation.path
        has_body = bool(operation.body)
        if not takes_id or has_body or operation.query:
            # Generated parameters and bodies, valid and invalid.
            runs += [(operation, GenerationMode.POSITIVE, None),
                     (operation, GenerationMode.NEGATIVE, None)]
        if takes_id:
            # Ids of the wrong type (what a typo or a fuzzer sends), then real rows.
            real = _real_path_parameters(operation.path, rows)
            runs.append((operation, GenerationMode.POSITIVE,
                         {name: "null,null" for name in real}))
            later = deletes if operation.method.upper() == "DELETE" else runs
            later.append((operation, GenerationMode.POSITIVE, real))
            if has_body:
                later.append((operation, GenerationMode.NEGATIVE, real))
    statuses: list[int] = []
    for operation, mode, path_parameters in runs + deletes + last:
        method = operation.method.upper()
        tried += 1
        self_revoking = (method, operation.path) in SELF_REVOKING
        try:
            if self_revoking:
                _exercise(operation, mode,
                          headers | {"Authorization": rows["disposable_authorization"]},
                          path_parameters, [])
            else:
                _exercise(operation, mode, headers, path_parameters, statuses)
        # schemathesis reports several failures of one operation as a FailureGroup (a
        # BaseExceptionGroup); every operation's are collected, then reported together.
        except (Exception, BaseExceptionGroup) as exc:
            ids = f" with ids {path_parameters}" if path_parameters else ""
            failures.append(f"{method} {operation.path} ({mode.value}{ids}): {exc}")
    assert methods == {"GET", "POST", "PUT", "PATCH", "DELETE"}
    assert tried > 200  # every operation, not a schema that lost its paths
    assert not failures, "\n\n".join(failures)
    # The token held until the end: no answer was a refused or throttled token, which would
    # have passed every check above while exercising nothing.
    assert 401 not in statuses and 429 not in statuses, sorted(set(statuses))
