"""A verified attempt settles the gateway's other open pushes only if they were committed
before it read its desired state: a push made meanwhile may stand for a change the attempt
never saw (a registry edit, new routes on the gateway) and must get its own attempt. Found
by the residency state machine: a gateway kept the previous routes for good, its newer
pushes 'superseded' without one attempt."""

from __future__ import annotations

import pytest

from fleetctl.fleet.services import pool_health_record, pool_model_create, pool_update
from fleetctl.traffic import push, selectors, services
from fleetctl.traffic.gateways.base import adapter_for
from fleetctl.traffic.models import Gateway, GatewayPush, Route
from tests.conftest import SYSTEM
from tests.traffic.residency_machine import envoy_view, url_servers

pytestmark = pytest.mark.slow
MODEL = "llama-3.1-8b-instruct"


@pytest.fixture
def edge(envoy, make_pool) -> Gateway:
    pool = make_pool(name="a", base_urls=["http://127.0.0.1:7401"])
    pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
    pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    services.route_create(actor=SYSTEM, name="chat", model_id=MODEL, primary_pool=pool)
    return Gateway.objects.create(name="edge", kind="envoy", admin_address=envoy.admin_url,
                                  options={"config_dir": str(envoy.workdir),
                                           "load_timeout_s": 30})


def test_an_attempt_does_not_settle_a_push_committed_after_it_read_its_state(
    edge, django_capture_on_commit_callbacks
):
    with django_capture_on_commit_callbacks():  # no worker here: attempts are made by hand
        services.gateway_set_routes(actor=SYSTEM, gateway=edge,
                                    routes=list(Route.objects.all()))
    first = GatewayPush.objects.get(gateway=edge)
    # The attempt reads what to send...
    known = push._open_pushes_now([edge.pk])[edge.pk]
    desired = selectors.gateway_desired_state(gateway=edge)
    # ...then the registry changes under it, which stores a push of its own.
    with django_capture_on_commit_callbacks():
        pool_update(actor=SYSTEM, pool=first.revision.route.primary_pool,
                    base_urls=["http://127.0.0.1:7402"])
    second = GatewayPush.objects.get(gateway=edge, reason="registry")

    push._push_record([push._push_io(first, desired, known)])

    first.refresh_from_db()
    second.refresh_from_db()
    assert first.status == "verified"
    assert second.status == "pending"  # it stands for an endpoint the attempt never sent
    push.push_execute(push_id=second.pk)
    second.refresh_from_db()
    assert second.status == "verified"
    adapter = adapter_for(selectors.gateway_spec(edge))
    assert adapter.matches(selectors.gateway_desired_state(gateway=edge), adapter.read_back())
    assert envoy_view(edge)[1]["a"] == url_servers("http://127.0.0.1:7402")
