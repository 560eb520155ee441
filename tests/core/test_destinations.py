"""Addresses people give fleetctl: what they may reach, and what one server is under any
spelling (fleetctl/core/destinations.py). Real sockets and the machine's own resolver."""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from fleetctl.core import destinations
from fleetctl.core.destinations import (
    DestinationRefused,
    DestinationUnresolved,
    destination_check,
    destination_request,
    host_spelling_problem,
    same_server_keys,
)

pytestmark = pytest.mark.django_db  # a registered gateway's admin API is an own service
LOOPBACK = [ipaddress.ip_network("127.0.0.0/8"), ipaddress.ip_network("::1/128")]


@pytest.fixture
def strict(settings: Any) -> None:
    """Nothing allow-listed, for any purpose: production's default."""
    settings.OUTBOUND_ALLOWED_NETWORKS = {"pools": [], "gateways": [], "webhooks": []}
    settings.OUTBOUND_DENY = []


@pytest.fixture
def server() -> Iterator[dict[str, Any]]:
    """A real HTTP server on 127.0.0.1 that records the Host header of every request."""
    seen: dict[str, Any] = {"hosts": []}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            seen["hosts"].append(self.headers.get("Host"))
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    seen["port"] = httpd.server_port
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield seen
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize(("host", "standard"), [
    ("127.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("0x7f.1", "127.0.0.1"),
    ("0177.0.0.1", "127.0.0.1"), ("0x7f000001", "127.0.0.1"), ("10.1", "10.0.0.1"),
    ("::ffff:127.0.0.1", "127.0.0.1"), ("::ffff:10.0.0.5", "10.0.0.5"),
])
def test_a_non_standard_spelling_of_an_address_is_refused_naming_the_standard_one(
        host: str, standard: str) -> None:
    problem = host_spelling_problem(host)
    assert problem is not None and f"write {standard}" in problem


@pytest.mark.parametrize("host", ["127.0.0.1", "10.0.0.5", "::1", "fd00::5", "localhost",
                                  "pool-a.internal", "gpu1.example.com"])
def test_standard_spellings_and_names_pass(host: str) -> None:
    assert host_spelling_problem(host) is None


@pytest.mark.parametrize("url", [
    "http://127.0.0.1:8101/v1", "http://localhost:8101", "http://LOCALHOST:8101",
    "http://127.0.0.5:8101", "http://[::1]:8101/", "https://127.0.0.1:8101",
    "http://0.0.0.0:8101",
])
def test_every_spelling_of_this_host_is_one_server(url: str) -> None:
    assert same_server_keys(url) == {("this-host", 8101)}


def test_this_hosts_own_interface_addresses_are_this_host_too() -> None:
    own = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    own = {address for address in own if not ipaddress.ip_address(address).is_loopback}
    if not own:
        own = {"127.0.0.1"}
    for address in own:
        host = f"[{address}]" if ":" in address else address
        assert same_server_keys(f"http://{host}:9000") == {("this-host", 9000)}


def test_other_servers_and_other_ports_are_other_servers() -> None:
    assert same_server_keys("http://10.9.9.9:80") == {("10.9.9.9", 80)}
    assert same_server_keys("http://10.9.9.9") == same_server_keys("http://10.9.9.9:80/v1")
    assert same_server_keys("https://10.9.9.9") == {("10.9.9.9", 443)}
    assert same_server_keys("http://localhost:1") != same_server_keys("http://localhost:2")


def test_a_name_that_does_not_resolve_is_said_so() -> None:
    with pytest.raises(DestinationUnresolved, match="does not resolve"):
        same_server_keys("http://no-such-host.invalid:80")


@pytest.mark.parametrize(("url", "why"), [
    ("http://127.0.0.1:9901/quitquitquit", "loopback"),
    ("http://localhost:9901/", "resolves to 127.0.0.1, which is loopback"),
    ("http://[::1]:9901/", "loopback"),
    ("http://0.0.0.0:9901/", "this host"),
    ("http://169.254.169.254/latest/meta-data/", "cloud metadata"),
    ("http://[fd00:ec2::254]/latest/", "cloud metadata"),
    ("http://100.100.100.200/", "cloud metadata"),
    ("http://169.254.10.1/", "link-local"),
    ("http://[fe80::1]/", "link-local"),
    ("http://[64:ff9b::7f00:1]/", "carries 127.0.0.1, which is loopback"),
    ("http://[2002:a9fe:a9fe::]/", "carries 169.254.169.254, which is a cloud metadata"),
    ("http://[::127.0.0.1]/", "carries 127.0.0.1"),
    ("http://224.0.0.1/", "multicast"),
])
def test_special_addresses_are_refused_with_the_reason(strict: None, url: str,
                                                       why: str) -> None:
    with pytest.raises(DestinationRefused) as refused:
        destination_check(url, purpose="webhooks")
    assert why in str(refused.value)
    assert "OUTBOUND_ALLOW_WEBHOOKS" in str(refused.value)


def test_an_address_of_this_hosts_interfaces_is_refused_like_loopback(strict: None) -> None:
    own = [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)
           if not ipaddress.ip_address(info[4][0]).is_loopback]
    for address in own:
        host = f"[{address}]" if ":" in address else address
        with pytest.raises(DestinationRefused, match="this host"):
            destination_check(f"http://{host}:8080/", purpose="webhooks")


def test_private_networks_where_fleets_live_are_allowed(strict: None) -> None:
    for url in ("http://10.0.3.7:8000/v1", "http://192.168.1.20/", "http://[fd12::7]:8000",
                "https://8.8.8.8/hook"):
        assert destination_check(url, purpose="pools").addresses


def test_an_allow_list_opens_its_networks_for_its_purpose_only(settings: Any) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = {"pools": LOOPBACK, "gateways": [], "webhooks": []}
    settings.OUTBOUND_DENY = []
    assert destination_check("http://127.0.0.1:8101", purpose="pools")
    with pytest.raises(DestinationRefused, match="loopback"):
        destination_check("http://127.0.0.1:8101", purpose="webhooks")
    # Metadata is not loopback: allowing loopback does not open it.
    with pytest.raises(DestinationRefused, match="metadata"):
        destination_check("http://169.254.169.254/", purpose="pools")


def test_own_services_are_refused_whatever_is_allowed(settings: Any) -> None:
    settings.OUTBOUND_ALLOWED_NETWORKS = {p: LOOPBACK for p in ("pools", "gateways",
                                                                "webhooks")}
    settings.REDIS_URL = "redis://127.0.0.1:6379/3"
    settings.OUTBOUND_DENY = ["127.0.0.1:8000", "http://localhost:8080"]
    for url, what in (("http://localhost:6379/", "Redis"),
                      ("http://127.0.0.1:8000/api/v1/pools/", "OUTBOUND_DENY"),
                      ("http://[::1]:8080/v1/chat/completions", "OUTBOUND_DENY"),
                      ("http://127.0.0.1:5432/", "database")):
        with pytest.raises(DestinationRefused, match=what):
            destination_check(url, purpose="webhooks")
    assert destination_check("http://127.0.0.1:8101/", purpose="webhooks")


def test_a_registered_gateways_admin_api_is_refused_to_webhooks_and_pools(settings: Any
                                                                          ) -> None:
    from fleetctl.traffic.models import Gateway

    settings.OUTBOUND_ALLOWED_NETWORKS = {p: LOOPBACK for p in ("pools", "gateways",
                                                                "webhooks")}
    Gateway.objects.create(name="edge", kind="envoy", admin_address="http://127.0.0.1:19901",
                           options={"config_dir": "/tmp/x"})
    for purpose in ("webhooks", "pools"):
        with pytest.raises(DestinationRefused, match="registered gateway's admin API"):
            destination_check("http://localhost:19901/runtime_modify?a=1", purpose=purpose)
    # A gateway's own admin URL is what gateways are registered with.
    assert destination_check("http://127.0.0.1:19901", purpose="gateways")


def test_a_request_goes_to_the_address_that_was_checked_not_to_a_second_lookup(
        settings: Any, server: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS rebinding: a name that resolves to an allowed address when checked and to a
    refused one a moment later. The resolver stands in for a DNS server (none runs here):
    it answers the first lookup with the test server's address and every later one with
    an address nothing listens on. The request must still reach the server, with the name
    in its Host header, after exactly one lookup."""
    settings.OUTBOUND_ALLOWED_NETWORKS = {"webhooks": LOOPBACK}
    settings.OUTBOUND_DENY = []
    real = socket.getaddrinfo
    lookups: list[str] = []

    def rebinding(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host == "receiver.test":
            lookups.append(host)
            target = "127.0.0.1" if len(lookups) == 1 else "127.0.0.9"
            return real(target, *args, **kwargs)
        return real(host, *args, **kwargs)

    monkeypatch.setattr(destinations.socket, "getaddrinfo", rebinding)
    answer = destination_request("POST", f"http://receiver.test:{server['port']}/hook",
                                 purpose="webhooks", content=b"{}", timeout_s=5)
    assert answer.status_code == 204
    assert lookups == ["receiver.test"]
    assert server["hosts"] == [f"receiver.test:{server['port']}"]


def test_a_refused_request_sends_nothing(strict: None, server: dict[str, Any]) -> None:
    with pytest.raises(DestinationRefused):
        destination_request("POST", f"http://127.0.0.1:{server['port']}/hook",
                            purpose="webhooks", content=b"{}", timeout_s=5)
    assert server["hosts"] == []
