"""One server, many spellings: residency compares what endpoints connect to, never how they
are written (issue 25: an EU pool's URL set to `http://localhost:<US port>` was accepted and
18 of 18 EU requests were answered by US hardware; `127.1`, `2130706433` and
`[::ffff:127.0.0.1]` took the pinned route down without the "drain first" refusal)."""

from __future__ import annotations

import ipaddress
import socket
from typing import Any

import pytest

from fleetctl.audit.models import AuditEvent
from fleetctl.fleet.models import Pool, Region
from fleetctl.fleet.services import pool_health_record, pool_model_create, region_create
from fleetctl.traffic.services import route_create
from tests.conftest import SYSTEM

MODEL = "llama-3.1-8b-instruct"
US_PORT = 7103


def _this_hosts_addresses() -> list[str]:
    found = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    return sorted(a for a in found if not ipaddress.ip_address(a).is_loopback)


@pytest.fixture
def fleet(db: None, make_pool: Any, region: Region) -> dict[str, Any]:
    """`chat-eu` pinned to the EU on eu-a; a US pool on 127.0.0.1:US_PORT."""
    eu = region_create(actor=SYSTEM, code="eu-central", name="EU Central", jurisdiction="EU")
    pools = {"eu-a": make_pool(name="eu-a", region=eu, base_urls=["http://127.0.0.1:7101"]),
             "us-a": make_pool(name="us-a", base_urls=[f"http://127.0.0.1:{US_PORT}"])}
    for pool in pools.values():
        pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
        pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    route_create(actor=SYSTEM, name="chat-eu", model_id=MODEL, residency="EU",
                 primary_pool=pools["eu-a"], weights={"eu-a": 100})
    return {"eu": eu, "pools": pools}


SAME_SERVER = ["localhost", "LOCALHOST", "127.0.0.1", "127.0.0.7", "[::1]"]


@pytest.mark.parametrize("host", SAME_SERVER + _this_hosts_addresses())
@pytest.mark.parametrize("path", ["", "/", "/v1"])
def test_an_eu_pool_cannot_take_the_us_pools_server_under_another_spelling(
        fleet, client_for, host: str, path: str) -> None:
    host = f"[{host}]" if ":" in host and not host.startswith("[") else host
    url = f"http://{host}:{US_PORT}{path}"
    answer = client_for("admin").patch("/api/v1/pools/eu-a/", {"base_urls": [url]},
                                       format="json")
    assert answer.status_code == 400, answer.content
    message = answer.json()["error"]["message"]
    assert "pool us-a's endpoint" in message and "in US" in message
    assert Pool.objects.get(name="eu-a").base_urls == ["http://127.0.0.1:7101"]


@pytest.mark.parametrize(("host", "standard"), [
    ("127.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("0x7f.1", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1"), ("[::ffff:127.0.0.1]", "127.0.0.1"),
])
def test_a_non_standard_address_spelling_is_refused_naming_the_standard_one(
        fleet, client_for, host: str, standard: str) -> None:
    answer = client_for("admin").patch(
        "/api/v1/pools/eu-a/", {"base_urls": [f"http://{host}:7101"]}, format="json")
    assert answer.status_code == 400, answer.content
    assert f"write {standard}" in answer.json()["error"]["message"]
    assert Pool.objects.get(name="eu-a").base_urls == ["http://127.0.0.1:7101"]


@pytest.mark.parametrize("host", ["0.0.0.0", "[::]"])
def test_an_unspecified_address_is_no_endpoint(fleet, client_for, host: str) -> None:
    answer = client_for("admin").patch(
        "/api/v1/pools/eu-a/", {"base_urls": [f"http://{host}:7101"]}, format="json")
    assert answer.status_code == 400, answer.content
    assert "this host" in answer.json()["error"]["message"]


def test_a_pool_a_pinned_route_relies_on_cannot_take_an_endpoint_that_does_not_resolve(
        fleet, client_for) -> None:
    admin = client_for("admin")
    answer = admin.patch("/api/v1/pools/eu-a/",
                         {"base_urls": ["http://gpu-7.unresolvable.invalid:8000"]},
                         format="json")
    assert answer.status_code == 409, answer.content
    message = answer.json()["error"]["message"]
    assert "chat-eu" in message and "Drain" in message and "does not resolve" in message
    assert Pool.objects.get(name="eu-a").base_urls == ["http://127.0.0.1:7101"]
    assert AuditEvent.objects.filter(action="pool.update", outcome="denied").count() == 1
    # A pool no pinned route relies on may name a server DNS does not know yet.
    assert admin.patch("/api/v1/pools/us-a/",
                       {"base_urls": ["http://gpu-7.unresolvable.invalid:8000"]},
                       format="json").status_code == 200


def test_two_unresolvable_names_are_still_one_server(fleet, client_for) -> None:
    admin = client_for("admin")
    assert admin.patch("/api/v1/pools/us-a/",
                       {"base_urls": ["http://gpu-7.unresolvable.invalid:8000"]},
                       format="json").status_code == 200
    created = admin.post("/api/v1/pools/", {
        "name": "eu-b", "runtime": "cuda", "accelerator": "H100", "region": "eu-central",
        "base_urls": ["https://GPU-7.unresolvable.invalid.:8000/v1"],
        "max_context_tokens": 4096, "node_hourly_rate": "1"}, format="json")
    assert created.status_code == 400 and "pool us-a's endpoint" in str(created.json())


def test_metadata_and_link_local_are_no_pool_endpoint(fleet, client_for) -> None:
    admin = client_for("admin")
    for url in ("http://169.254.169.254:80", "http://[fd00:ec2::254]/", "http://169.254.1.1/"):
        answer = admin.post("/api/v1/pools/", {
            "name": "meta", "runtime": "cuda", "accelerator": "H100", "region": "us-east",
            "base_urls": [url], "max_context_tokens": 4096, "node_hourly_rate": "1"},
            format="json")
        assert answer.status_code == 400, answer.content
        assert "OUTBOUND_ALLOW_POOLS" in answer.json()["error"]["message"]
    assert not Pool.objects.filter(name="meta").exists()
