"""What only HAProxy does, against a real HAProxy 2.6 in front of real simulated pools: its
answer to a repeated residency header, weights kept through an operator's reload, streams
finishing on the old worker, and a weights change costing less than a reload. What every
gateway kind does is in tests/traffic/contract/."""

from __future__ import annotations

import httpx
import pytest

from fleetctl.demo.haproxy_process import HAProxyProcess
from tests.sim.simproc import MODEL
from tests.support.waiting import wait_until
from tests.traffic.scenarios import RESIDENCY, Harness, ask, route, slowed

pytestmark = pytest.mark.slow


def test_a_repeated_residency_header_is_refused(harness: Harness) -> None:
    harness.apply(route({"gamma": 10000}, key="chat-in", residency="IN"))
    before = harness.served()
    answer = httpx.post(f"{harness.url}/v1/chat/completions",
                        json={"model": MODEL, "messages": [{"role": "user", "content": "x"}]},
                        headers=[(RESIDENCY, "IN"), (RESIDENCY, "EU")])
    assert answer.status_code == 400
    assert answer.json()["error"]["code"] == "bad_header"
    assert harness.served_since(before) == {"alpha": 0, "beta": 0, "gamma": 0}


def test_runtime_weights_survive_a_reload(harness: Harness, haproxy: HAProxyProcess) -> None:
    harness.apply(route({"alpha": 7000, "beta": 3000}))  # in the config file
    desired = harness.desired(route({"alpha": 10000, "beta": 0}, revision=2))
    assert harness.adapter.apply(desired).method == "runtime"  # only in the running worker
    worker = haproxy.current_worker()
    haproxy.reload()  # as an operator would: same config file, state saved first
    assert haproxy.current_worker() != worker
    assert harness.adapter.read_back() == {"chat": {"alpha": 10000}}
    assert harness.adapter.matches(desired, harness.adapter.read_back())
    before = harness.served()
    client = harness.client()
    for _ in range(10):
        ask(client)
    assert harness.served_since(before) == {"alpha": 10, "beta": 0, "gamma": 0}


def test_a_stream_outlives_a_reload_on_the_old_worker_and_is_counted(
        harness: Harness, haproxy: HAProxyProcess) -> None:
    harness.apply(route({"alpha": 0, "beta": 10000}))
    with slowed(harness.sim, "beta", 50):  # 100 ms per token: ~4 s, outlasting the reload
        stream = harness.client().chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "a long one"}], max_tokens=40,
            stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        first = [next(chunks) for _ in range(3)]
        worker = haproxy.current_worker()
        result = harness.apply(route({"alpha": 10000, "beta": 0}, revision=2),
                               route({"gamma": 10000}, key="chat-in", residency="IN"))
        assert result.method == "reload"
        assert haproxy.current_worker() != worker
        assert harness.adapter.in_flight("beta") == 1  # seen on the old worker
        rest = list(chunks)
    assert len([c for c in first + rest if c.choices and c.choices[0].delta.content]) == 40
    assert rest[-1].choices[0].finish_reason == "length"
    wait_until(lambda: harness.adapter.in_flight("beta") == 0, timeout_s=30,
               what="the drained pool's stream to end")
