"""The registry of gateway kinds and the options schema every kind's options go through."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetctl.traffic.gateways import registry
from fleetctl.traffic.gateways.base import GatewaySpec, adapter_for
from fleetctl.traffic.gateways.schema import OptionsError

ROOT = Path(__file__).resolve().parents[2]
REQUIRED = {"envoy": {"config_dir": "/srv/envoy"},
            "envoy-xds": {},
            "haproxy": {"bind": "127.0.0.1:8080", "config_path": "/srv/h/haproxy.cfg",
                        "master_socket": "/srv/h/master.sock"},
            "nginx": {"listen": "127.0.0.1:8080"},
            "gateway-api": {}}


def test_the_five_kinds_are_found_from_their_folders() -> None:
    assert registry.choices() == [("envoy", "Envoy"), ("envoy-xds", "Envoy (xDS)"),
                                  ("gateway-api", "Kubernetes Gateway API"),
                                  ("haproxy", "HAProxy"), ("nginx", "nginx")]
    for name, kind in registry.kinds().items():
        assert kind.adapter.kind == name and kind.package.endswith(name.replace("-", "_"))
        assert kind.required_options() == tuple(REQUIRED[name])


@pytest.mark.parametrize("name", sorted(REQUIRED))
def test_the_required_options_alone_give_every_default(name: str) -> None:
    kind = registry.get(name)
    options = kind.parse_options(REQUIRED[name])
    for info in kind.option_infos():
        assert getattr(options, info.name) == (REQUIRED[name].get(info.name) if info.required
                                               else info.default)


@pytest.mark.parametrize(("name", "raw", "problems"), [
    ("envoy", {}, ["options.config_dir is required: the directory Envoy's bootstrap watches"]),
    ("envoy", {"config_dir": "/x", "load_timeout_s": "5", "typo": 1},
     ["options.typo is not an option of Envoy gateways; theirs are access_log, "
      "admin_timeout_s, config_dir, listen_url, load_timeout_s",
      'options.load_timeout_s must be a number, not "5"']),
    ("haproxy", {**REQUIRED["haproxy"], "health_checks": 1},
     ["options.health_checks must be true or false, not 1"]),
    ("nginx", {"listen": "8080", "worker_processes": 2.5, "model_source": "json"},
     ["options.listen must be HOST:PORT, not '8080'",
      "options.worker_processes must be a whole number, not 2.5",
      'options.model_source must be one of "body", "header", not "json"']),
    ("gateway-api", {"paths": "/v1/chat/completions", "services": {"a": {"port": 0}}},
     ['options.services [\'a\'].port must be a port number from 1 to 65535',
      'options.paths must be a list of strings, not "/v1/chat/completions"']),
    ("envoy", ["config_dir"], ['options must be an object of option names and values, not '
                               '["config_dir"]']),
])
def test_bad_options_are_one_permanent_error_naming_each_option(name, raw, problems) -> None:
    with pytest.raises(OptionsError) as caught:
        registry.get(name).parse_options(raw)
    assert caught.value.permanent
    assert sorted(p[:len(q)] for p, q in zip(sorted(caught.value.problems), sorted(problems),
                                             strict=True)) == sorted(problems)


def test_building_an_adapter_checks_its_options_first() -> None:
    with pytest.raises(OptionsError, match=r"options\.listen is required"):
        adapter_for(GatewaySpec("lb", "nginx", "/srv/nginx", {}))
    adapter = adapter_for(GatewaySpec("lb", "nginx", "/srv/nginx", REQUIRED["nginx"]))
    assert adapter.options.listen == "127.0.0.1:8080" and adapter.label == "nginx"


@pytest.mark.parametrize(("name", "address", "ok"), [
    ("envoy", "http://127.0.0.1:9901", True), ("envoy", "127.0.0.1:9901", False),
    ("gateway-api", "https://k8s:6443", True), ("gateway-api", "https://k8s:x", False),
    ("haproxy", "/run/haproxy/admin.sock", True), ("haproxy", "127.0.0.1:9999", True),
    ("haproxy", "admin.sock", False), ("nginx", "/srv/nginx", True),
    ("nginx", "srv/nginx", False), ("nginx", "/" + "p" * 100, False),
])
def test_each_kind_says_what_its_address_holds(name: str, address: str, ok: bool) -> None:
    assert (registry.get(name).address_problem(address) is None) == ok


def test_an_unknown_kind_is_a_permanent_error_listing_the_known_ones() -> None:
    with pytest.raises(Exception, match="no adapter for gateway kind 'squid'") as caught:
        adapter_for(GatewaySpec("x", "squid", "http://x"))
    assert caught.value.permanent  # type: ignore[attr-defined]


def test_the_docs_name_every_option_of_every_kind() -> None:
    docs = (ROOT / "docs" / "gateways.md").read_text() + (ROOT / "docs" / "envoy.md").read_text()
    missing = [f"{name}.{info.name}" for name, kind in registry.kinds().items()
               for info in kind.option_infos() if f"`{info.name}`" not in docs
               and f"options.{info.name}`" not in docs]
    assert not missing
