"""The health policy: a pool the probe marks unhealthy is drained, as the system, off the
routes whose policy says so; it comes back on `drain-restore` routes when healthy again."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.test import Client

from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import HealthTransition, Pool
from fleetctl.fleet.services import pool_health_record
from fleetctl.traffic import health, selectors, services
from fleetctl.traffic.models import Drain, Route
from fleetctl.webhooks.models import Delivery
from fleetctl.webhooks.services import webhook_create
from tests.conftest import SYSTEM

pytestmark = pytest.mark.django_db
MODEL = "llama-3.1-8b-instruct"


def _flip(pool: Pool, *, ok: bool) -> HealthTransition:
    needed = (settings.HEALTH_SUCCESSES_TO_HEALTHY if ok
              else settings.HEALTH_FAILURES_TO_UNHEALTHY)
    for _ in range(needed):
        pool_health_record(pool_id=pool.pk, ok=ok, status_code=200 if ok else 503,
                           latency_ms=1.0, error="" if ok else "GET /v1/models answered 503")
    return HealthTransition.objects.filter(pool=pool).order_by("-at", "-id").first()


def _weights(route: Route) -> dict[str, int]:
    route.refresh_from_db()
    current = selectors.revision_current(route=route)
    return current.weights if current else {}


@pytest.fixture
def routes(route: Route) -> dict[str, Route]:
    """`llama` (policy drain), `llama-fast` (drain-restore), `llama-batch` (off): each 80/20
    on primary/cand."""
    pools = {p.name: p for p in Pool.objects.all()}
    made = {"llama": route}
    for name, latency, policy in (("llama-fast", "interactive", "drain-restore"),
                                  ("llama-batch", "batch", "off")):
        made[name] = services.route_create(
            actor=SYSTEM, name=name, model_id=MODEL, latency_class=latency,
            primary_pool=pools["primary"], weights={"primary": 80, "cand": 20},
            health_policy=policy)
    webhook_create(actor=SYSTEM, name="oncall", url="http://127.0.0.1:9/hook",
                   events=["drain.automatic"])
    return made


def test_an_unhealthy_pool_is_drained_once_off_the_routes_whose_policy_says_so(routes):
    cand = Pool.objects.get(name="cand")
    flip = _flip(cand, ok=False)

    made = health.policy_apply(transition_id=flip.pk)
    # Twice (a redelivered task): nothing more.
    assert health.policy_apply(transition_id=flip.pk) == []

    assert len(made) == 2  # one per policy, so drain-restore routes can come back alone
    drains = Drain.objects.filter(health_transition=flip).order_by("pk")
    assert {d.requested_by for d in drains} == {"system:health-policy"}
    assert all(f"health check {flip.health_check_id}" in d.reason
               and "GET /v1/models answered 503" in d.reason for d in drains)
    assert _weights(routes["llama"]) == {"primary": 10_000}
    assert _weights(routes["llama-fast"]) == {"primary": 10_000}
    assert _weights(routes["llama-batch"]) == {"primary": 8_000, "cand": 2_000}
    deliveries = Delivery.objects.filter(event="drain.automatic")
    assert deliveries.count() == 2
    assert {tuple(d.payload["data"]["routes"]) for d in deliveries} == {
        ("llama",), ("llama-fast",)}


def test_healthy_again_restores_only_drain_restore_routes(routes):
    cand = Pool.objects.get(name="cand")
    health.policy_apply(transition_id=_flip(cand, ok=False).pk)
    back = _flip(cand, ok=True)

    [restore] = health.policy_apply(transition_id=back.pk)
    assert health.policy_apply(transition_id=back.pk) == []

    assert restore.action == Drain.Action.RESTORE and restore.health_transition == back
    assert _weights(routes["llama-fast"]) == {"primary": 8_000, "cand": 2_000}
    assert _weights(routes["llama"]) == {"primary": 10_000}  # `drain`: a person restores


def test_a_route_changed_since_the_drain_is_not_restored_and_says_why(routes):
    cand = Pool.objects.get(name="cand")
    health.policy_apply(transition_id=_flip(cand, ok=False).pk)
    fast = routes["llama-fast"]
    fast.refresh_from_db()
    services.revision_create(actor=SYSTEM, route=fast, weights={"primary": 99, "cand": 1},
                             base_revision=fast.revision_number, reason="a trickle by hand",
                             force=True)
    back = _flip(cand, ok=True)

    assert health.policy_apply(transition_id=back.pk) == []
    assert health.policy_apply(transition_id=back.pk) == []

    [refused] = AuditEvent.objects.filter(action=health.RESTORE_REFUSED)
    assert "changed after this drain" in refused.message
    assert _weights(fast) == {"primary": 9_900, "cand": 100}
    last = Delivery.objects.filter(event="drain.automatic").order_by("-pk").first()
    assert last.payload["data"]["action"] == "restore-refused"
    assert "changed after this drain" in last.payload["data"]["why"]


def test_a_stale_transition_does_nothing(routes):
    cand = Pool.objects.get(name="cand")
    down = _flip(cand, ok=False)
    _flip(cand, ok=True)  # recovered before the task ran
    assert health.policy_apply(transition_id=down.pk) == []
    assert not Drain.objects.exists()


def test_the_route_api_sets_the_health_policy(routes, token_client):
    client = token_client(["fleet"], "platform-lead")
    answer = client.post("/api/v1/routes/llama/health-policy/",
                         {"health_policy": "drain-restore"}, format="json")
    assert answer.status_code == 200, answer.json()
    assert answer.json()["health_policy"] == "drain-restore"
    bad = client.post("/api/v1/routes/llama/health-policy/", {"health_policy": "restore"},
                      format="json")
    assert bad.status_code == 400 and "health_policy" in str(bad.json())
    reader = token_client(["read"], "platform-lead")
    denied = reader.post("/api/v1/routes/llama/health-policy/", {"health_policy": "off"},
                         format="json")
    assert denied.status_code == 403
    routes["llama"].refresh_from_db()
    assert routes["llama"].health_policy == "drain-restore"


def test_the_route_page_sets_the_health_policy(routes, make_user):
    lead, viewer = Client(), Client()
    lead.force_login(make_user("lena", "platform-lead"))
    viewer.force_login(make_user("vera", "viewer"))
    page = lead.get("/traffic/routes/llama/")
    assert 'name="health_policy"' in page.content.decode()
    assert "name=\"health_policy\"" not in viewer.get("/traffic/routes/llama/").content.decode()
    answer = lead.post("/traffic/routes/llama/health-policy/", {"health_policy": "off"},
                       follow=True)
    assert "Health policy of llama: off" in answer.content.decode()
    viewer.post("/traffic/routes/llama/health-policy/", {"health_policy": "drain-restore"})
    routes["llama"].refresh_from_db()
    assert routes["llama"].health_policy == "off"


def test_the_drain_page_says_the_drain_was_automatic_with_the_probe_evidence(routes, make_user):
    cand = Pool.objects.get(name="cand")
    flip = _flip(cand, ok=False)
    drain = health.policy_apply(transition_id=flip.pk)[0]
    reader = Client()
    reader.force_login(make_user("vera", "viewer"))
    page = reader.get(f"/traffic/drains/{drain.pk}/").content.decode()
    assert "By the health policy: pool" in page
    assert f"Probe evidence: health check {flip.health_check_id}" in page
    assert "GET /v1/models answered 503" in page
