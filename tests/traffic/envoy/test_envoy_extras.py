"""What only Envoy does, against a real Envoy in front of real simulated pools: the body
parsed as JSON for the model, its answer to repeated residency headers, file swaps and DNS
clusters, the runtime file a restart starts from, the admin calls a weights change costs,
a file Envoy rejects being put back, admin timeouts. What every gateway kind does is in
tests/traffic/contract/."""

from __future__ import annotations

import json
import socket
import time
import uuid
from typing import Any

import httpx
import pytest
from openai.types.chat import ChatCompletionMessageParam

from fleetctl.core.files import write_atomically
from fleetctl.core.ports import free_port
from fleetctl.traffic.gateways.base import AdapterError, GatewaySpec, PoolTarget
from fleetctl.traffic.gateways.envoy import render as envoy_config
from fleetctl.traffic.gateways.envoy.adapter import EnvoyAdapter
from fleetctl.traffic.gateways.envoy.runtime import read_runtime_file
from tests.support.waiting import wait_until

from .conftest import MODEL, OTHER_MODEL, Gateway, route, state

pytestmark = pytest.mark.slow

HELLO: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hello"}]


def ask(gw: Gateway, model: str = MODEL, **extra: Any) -> str:
    """One short chat completion through Envoy; returns its response id."""
    answer = gw.client().chat.completions.create(model=model, messages=HELLO, max_tokens=1,
                                                 **extra)
    return answer.id


def post(gw: Gateway, body: dict[str, Any] | bytes, **headers: str) -> tuple[httpx.Response, str]:
    """A raw POST with a fresh x-request-id, so the pools' ground truth can be searched."""
    request_id = f"req-{uuid.uuid4().hex}"
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    answer = httpx.post(f"{gw.url}/v1/chat/completions", content=content, timeout=30,
                        headers={"content-type": "application/json",
                                 "x-request-id": request_id, **headers})
    return answer, request_id


# --- residency and models ---------------------------------------------------------------------

def test_a_refusal_names_the_jurisdiction_the_request_asked_for(gateway: Gateway) -> None:
    gateway.adapter.apply(state(gateway.pools("pb"), route("chat-eu", {"pb": 10000},
                                                           residency="EU")))
    refused, refused_id = post(gateway, {"model": MODEL, "messages": HELLO, "max_tokens": 1},
                               **{"x-fleetctl-residency": "US"})
    assert refused.status_code == 403
    assert "jurisdiction US" in refused.json()["error"]["message"]
    assert refused_id not in gateway.served_by()


def test_a_request_naming_two_jurisdictions_is_refused(gateway: Gateway) -> None:
    gateway.adapter.apply(state(gateway.pools("pb"), route("chat-eu", {"pb": 10000},
                                                           residency="EU")))
    body = json.dumps({"model": MODEL, "messages": HELLO, "max_tokens": 1})
    pinned = [("x-fleetctl-residency", "EU"), ("content-type", "application/json")]

    answers = [httpx.post(f"{gateway.url}/v1/chat/completions", content=body, timeout=10,
                          headers=[*extra, *pinned]).status_code
               for extra in ([], [("x-fleetctl-residency", "US")],
                             [("x-fleetctl-residency", "EU")])]

    assert answers == [200, 403, 403]


def test_only_the_top_level_model_of_the_body_counts(gateway: Gateway) -> None:
    gateway.adapter.apply(state(gateway.pools("pa", "pb"), route("chat", {"pa": 10000}),
                                route("qwen", {"pb": 10000}, model=OTHER_MODEL)))
    # A prompt that quotes a model and ends in a backslash, a nested "model", and the
    # top-level key twice (duplicate keys are legal JSON; Python keeps the last).
    prompt = json.dumps(f'"model": "{MODEL}", C:\\')
    body = (f'{{"metadata": {{"model": "{MODEL}"}}, "model": "{MODEL}", "max_tokens": 1, '
            f'"messages": [{{"role": "user", "content": {prompt}}}], '
            f'"model": "{OTHER_MODEL}"}}').encode()
    assert json.loads(body)["model"] == OTHER_MODEL
    decoys_after = {"model": OTHER_MODEL, "max_tokens": 1, "metadata": {"model": MODEL},
                    "messages": [{"role": "user", "content": f'"model": "{MODEL}"'}]}

    answer, request_id = post(gateway, body)
    after, after_id = post(gateway, decoys_after)

    assert (answer.status_code, after.status_code) == (200, 200), answer.text
    # The last top-level key counts, as Python's json (and so the pool) reads it.
    served = gateway.served_by(request_id, after_id)
    assert (served[request_id], served[after_id]) == ("pb", "pb")


def test_the_models_listing_names_the_routed_models_and_a_404_the_model_asked_for(
        gateway: Gateway) -> None:
    gateway.adapter.apply(state(gateway.pools("pa"), route("chat", {"pa": 10000})))
    answer, _ = post(gateway, {"model": "no-such-model", "messages": HELLO})
    listing = httpx.get(f"{gateway.url}/v1/models", timeout=5)
    assert answer.status_code == 404
    assert "no-such-model" in answer.json()["error"]["message"]
    assert [m["id"] for m in listing.json()["data"]] == [MODEL]


# --- structure, drift, failures ---------------------------------------------------------------

def test_adding_and_removing_a_pool_and_a_route_swaps_the_files(gateway: Gateway) -> None:
    first = state(gateway.pools("pa"), route("chat", {"pa": 10000}))
    gateway.adapter.apply(first)
    # By name, so the DNS flavour of cluster is exercised too.
    by_name = PoolTarget("pc", (gateway.sims.url("pc").replace("127.0.0.1", "localhost"),), "EU")
    grown = state({**gateway.pools("pa"), "pc": by_name},
                  route("chat", {"pa": 5000, "pc": 5000}),
                  route("qwen", {"pc": 10000}, model=OTHER_MODEL))

    result = gateway.adapter.apply(grown)
    qwen = ask(gateway, model=OTHER_MODEL)

    assert result.method == "file-swap"
    assert gateway.adapter.read_back() == grown.held_weights()
    assert gateway.served_by(qwen)[qwen] == "pc"

    gateway.adapter.apply(first)
    assert gateway.adapter.read_back() == first.held_weights()
    clusters = httpx.get(f"{gateway.process.admin_url}/clusters?format=json", timeout=5).json()
    assert [c["name"] for c in clusters.get("cluster_statuses", [])] == ["pa"]


def test_an_envoy_restarted_after_a_route_changed_shape_holds_the_new_split(
        gateway: Gateway) -> None:
    gateway.adapter.apply(state(gateway.pools("pa"), route("chat", {"pa": 10000})))
    reshaped = state(gateway.pools("pa", "pb"), route("chat", {"pa": 2000, "pb": 8000}))
    assert gateway.adapter.apply(reshaped).method == "file-swap"
    moved = state(gateway.pools("pa", "pb"), route("chat", {"pa": 0, "pb": 10000}))
    assert gateway.adapter.apply(moved).method == "runtime"

    gateway.process.kill()
    gateway.process.start(timeout_s=60)

    # Before fleetctl talks to it again, Envoy starts from the weights of the last push.
    entries = httpx.get(f"{gateway.process.admin_url}/runtime?format=json",
                        timeout=5).json()["entries"]
    assert {key.rsplit(".", 1)[1]: entry["final_value"] for key, entry in entries.items()
            if key.startswith("fleetctl.chat.")} == {"pa": "0", "pb": "10000"}
    assert gateway.adapter.read_back() == moved.held_weights()
    # Only the keys of the loaded routes are on disk: an old shape's keys are gone.
    on_disk = envoy_config.runtime_file_weights(read_runtime_file(gateway.process.workdir))
    assert sorted(key.rsplit(".", 1)[1] for key in on_disk) == ["pa", "pb"]


def test_a_weights_change_after_a_verified_read_back_is_one_post_and_a_stale_memory_is_caught(
        gateway: Gateway, monkeypatch: pytest.MonkeyPatch) -> None:
    pools = gateway.pools("pa", "pb")
    even = state(pools, route("chat", {"pa": 5000, "pb": 5000}))
    moved = state(pools, route("chat", {"pa": 0, "pb": 10000}))
    gateway.adapter.apply(even)
    assert gateway.adapter.matches(even, gateway.adapter.read_back())
    calls: list[str] = []
    request = gateway.adapter.admin._request

    def counted(method: str, path: str, **kwargs: Any) -> bytes:
        calls.append(f"{method} {path}")
        return request(method, path, **kwargs)

    monkeypatch.setattr(gateway.adapter.admin, "_request", counted)

    assert gateway.adapter.apply(moved).method == "runtime"
    assert calls == ["POST /runtime_modify"]  # Envoy's load state is known from the read-back
    assert gateway.adapter.read_back() == moved.held_weights()
    assert "GET /config_dump" not in calls  # the route structure of that version is known

    # Restarted empty, then handed the clusters file (and nothing else) behind fleetctl's
    # back: disk and clusters look as remembered, so the apply only posts weights; the
    # read-back sees Envoy's real routes (none), and the next apply repairs them.
    clusters = gateway.process.workdir / "clusters.json"
    kept = clusters.read_text()
    gateway.process.kill()
    gateway.process.forget_configuration()
    gateway.process.start(timeout_s=60)
    write_atomically(clusters, kept)
    wanted = json.loads(kept)["version_info"]
    wait_until(lambda: gateway.adapter.admin.load_state().clusters_version == wanted,
               timeout_s=30, every_s=0.01, what="Envoy to load the clusters file")
    assert gateway.adapter.apply(even).method == "runtime"
    assert not gateway.adapter.matches(even, gateway.adapter.read_back())
    assert gateway.adapter.apply(even).method == "file-swap"
    assert gateway.adapter.matches(even, gateway.adapter.read_back())
    answered = ask(gateway)
    assert gateway.served_by(answered)[answered] in ("pa", "pb")


def test_a_pool_envoy_cannot_route_to_is_left_out_and_everything_else_applies(
        gateway: Gateway) -> None:
    # As a pool stored before the registry checked base URLs would arrive.
    bad = PoolTarget("pc", (f"{gateway.sims.url('pc')}/openai",), "EU")
    desired = state({**gateway.pools("pa", "pb"), "pc": bad},
                    route("chat", {"pa": 10000, "pc": 0}),
                    route("qwen", {"pb": 5000, "pc": 5000}, model=OTHER_MODEL),
                    route("qwen-eu", {"pc": 10000}, model=OTHER_MODEL, residency="EU"))

    result = gateway.adapter.apply(desired)

    assert result.warning == ("pool pc left out: this gateway cannot route to a base URL with "
                              "a path (/openai): give the server's root URL (requests keep "
                              "their /v1/... path)")
    assert result.warning in result.detail
    # pc's share goes to the route's other pools with weight; with none left, the route
    # answers an error (fails closed), as an empty split does.
    held = gateway.adapter.read_back()
    assert held == {"chat": {"pa": 10000}, "qwen": {"pb": 10000}, "qwen-eu": {}}
    assert gateway.adapter.matches(desired, held)
    qwen = ask(gateway, model=OTHER_MODEL)
    assert gateway.served_by(qwen)[qwen] == "pb"
    refused, _ = post(gateway, {"model": OTHER_MODEL, "messages": HELLO},
                      **{"x-fleetctl-residency": "EU"})
    assert refused.status_code == 503

    # Corrected, it is routed to again. Where it has no weight only the clusters tell the
    # difference, and they do, so a reconcile re-pushes and the next push renders it.
    at_zero = route("chat", {"pa": 10000, "pc": 0})
    gateway.adapter.apply(state({**gateway.pools("pa"), "pc": bad}, at_zero))
    fixed = state(gateway.pools("pa", "pc"), at_zero)
    held = gateway.adapter.read_back()
    assert held == fixed.held_weights()
    assert not gateway.adapter.matches(fixed, held)
    assert gateway.adapter.apply(fixed).warning == ""
    assert gateway.adapter.matches(fixed, gateway.adapter.read_back())
    clusters = httpx.get(f"{gateway.process.admin_url}/clusters?format=json", timeout=5).json()
    assert {c["name"] for c in clusters.get("cluster_statuses", [])} == {"pa", "pc"}


def test_a_routes_file_envoy_rejects_is_put_back(gateway: Gateway) -> None:
    desired = state(gateway.pools("pa"), route("chat", {"pa": 10000}))
    gateway.adapter.apply(desired)
    routes = gateway.process.workdir / "routes.json"
    good = routes.read_text()
    before = gateway.adapter.admin.load_state()

    # validate() refuses every state it knows Envoy would, so a broken file goes through the
    # same swap directly, to see Envoy's refusal detected and the good file put back.
    with pytest.raises(AdapterError) as caught:
        gateway.adapter._swap(routes, good.replace('"prefix": "/v1/"', '"prefix": 7'),
                              "r-broken", before, routes=True)

    assert caught.value.permanent and "rejected" in str(caught.value)
    assert routes.read_text() == good
    assert gateway.adapter.read_back() == desired.held_weights()


def test_apply_to_an_envoy_that_is_down_fails_quickly_and_can_be_retried(tmp_path: Any) -> None:
    # Long timeouts, so "quickly" has a wide margin on a loaded machine: a refused connection
    # is reported at once, and an adapter that waited for any timeout would take 30 s.
    adapter = EnvoyAdapter(GatewaySpec("down", "envoy", f"http://127.0.0.1:{free_port()}",
                                       {"config_dir": str(tmp_path), "admin_timeout_s": 30,
                                        "load_timeout_s": 30}))
    started = time.monotonic()
    with pytest.raises(AdapterError) as caught:
        adapter.apply(state({}))
    assert not caught.value.permanent
    assert "unreachable" in str(caught.value)
    assert time.monotonic() - started < 10


def test_an_admin_api_that_hangs_times_out_in_about_two_seconds(tmp_path: Any) -> None:
    with socket.socket() as silent:  # accepts connections, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        adapter = EnvoyAdapter(GatewaySpec("hung", "envoy", f"http://127.0.0.1:{port}",
                                           {"config_dir": str(tmp_path)}))
        started = time.monotonic()
        with pytest.raises(AdapterError) as caught:
            adapter.read_back()
        elapsed = time.monotonic() - started
    assert not caught.value.permanent and "timed out" in str(caught.value)
    # The 2 s default, once: not sooner (a floor load cannot lower), and not a second
    # attempt or a longer default (with 2 s of room for a loaded machine).
    assert 1.9 <= elapsed < 4.0
