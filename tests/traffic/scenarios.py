"""What every proxy gateway (HAProxy, nginx) must do with real traffic, written once.

Each scenario drives the official `openai` client through a real gateway process in front of
real simulated pools (`python -m fleetctl.sim`), and counts what each pool served from its
own `/metrics` (`vllm:request_success_total`). The test modules of each gateway call these
functions from tests whose names say what is checked.
"""

from __future__ import annotations

import functools
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest

from fleetctl.traffic.gateways.base import (
    Adapter,
    AdapterError,
    ApplyResult,
    DesiredState,
    PoolTarget,
    RouteSpec,
)
from tests.noise import FALSE_FAILURE, binomial_tolerance
from tests.sim.simproc import MODEL, TEST_PROFILES, SimProcess

# alpha and beta serve the unpinned route in the US; gamma is the only pool in India.
POOLS = {"alpha": "US", "beta": "US", "gamma": "IN"}
RESIDENCY = "x-fleetctl-residency"


def start_fleet(directory: Path) -> SimProcess:
    directory.mkdir(parents=True, exist_ok=True)
    profiles = directory / "profiles.toml"
    profiles.write_text(TEST_PROFILES)
    args = ["--profiles", str(profiles), "--log-level", "WARNING"]
    for name in POOLS:
        args += ["--pool", f"{name}=quick@0"]
    return SimProcess(args, len(POOLS), directory / "sim.log")


def route(weights: dict[str, int], *, key: str = "chat", residency: str = "",
          latency_class: str = "", model: str = MODEL, revision: int = 1) -> RouteSpec:
    return RouteSpec(key=key, model=model, latency_class=latency_class, residency=residency,
                     revision=revision, weights=weights)


@dataclass
class Harness:
    """A gateway process, its adapter, and the simulated pools behind it."""

    url: str
    adapter: Adapter
    sim: SimProcess
    extra_pools: dict[str, PoolTarget] | None = None

    def pools(self) -> dict[str, PoolTarget]:
        pools = {name: PoolTarget(name=name, base_urls=(self.sim.url(name),), jurisdiction=j)
                 for name, j in POOLS.items()}
        return {**pools, **(self.extra_pools or {})}

    def desired(self, *routes: RouteSpec) -> DesiredState:
        return DesiredState(routes=routes, pools=self.pools())

    def apply(self, *routes: RouteSpec) -> ApplyResult:
        return self.adapter.apply(self.desired(*routes))

    def client(self, **headers: str) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="sim", max_retries=0,
                             timeout=30, default_headers=headers or None)

    def served(self) -> dict[str, int]:
        return {name: served_by(self.sim.url(name)) for name in POOLS}

    def served_since(self, before: dict[str, int]) -> dict[str, int]:
        now = self.served()
        return {name: now[name] - before[name] for name in POOLS}


def served_by(pool_url: str) -> int:
    text = httpx.get(f"{pool_url}/metrics", timeout=5).text
    return int(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("vllm:request_success_total{")))


def ask(client: openai.OpenAI, model: str = MODEL) -> str:
    answer = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "ping"}], max_tokens=2)
    return answer.choices[0].finish_reason or ""


def error_of(call: Callable[[], object]) -> openai.APIStatusError:
    with pytest.raises(openai.APIStatusError) as caught:
        call()
    return caught.value


def wait_until(predicate: Callable[[], bool], timeout_s: float = 30.0) -> bool:
    """Poll until `predicate` holds; generous, as waiting costs nothing once it does."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


@contextmanager
def slowed(sim: SimProcess, pool: str, slowdown: float) -> Iterator[None]:
    """Make one pool's decode steps `slowdown` times longer, so a stream lasts seconds."""
    httpx.post(f"{sim.url(pool)}/admin/faults", json={"slowdown": slowdown}, timeout=5)
    try:
        yield
    finally:
        httpx.post(f"{sim.url(pool)}/admin/reset", timeout=5)


# --- scenarios ---------------------------------------------------------------------------------

def openai_round_trip(h: Harness) -> None:
    h.apply(route({"alpha": 5000, "beta": 5000}))
    client = h.client()
    answer = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=8)
    assert answer.choices[0].message.content
    assert answer.usage is not None and answer.usage.completion_tokens > 0
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hello"}], max_tokens=12,
        stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    # Same model and prompt give the same text on every pool: the stream extends the answer.
    assert text.startswith(answer.choices[0].message.content or "-")
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 12


def split_follows_weights(h: Harness, requests: int = 400) -> None:
    """70/30 split: what each pool served is within the exact binomial bound (false failure
    1e-6, ~5 sigma) of the share the gateway reports it holds (HAProxy rounds 70/30 to
    179/77 of 256, so the held share is used). 400 requests keep an even split, or one that
    ignores the weights, well outside it."""
    desired = h.desired(route({"alpha": 7000, "beta": 3000}))
    h.adapter.apply(desired)
    held = h.adapter.read_back()["chat"]
    share = held["alpha"] / sum(held.values())
    client = h.client()
    before = h.served()
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(lambda _: ask(client), range(requests)))
    served = h.served_since(before)
    assert served["alpha"] + served["beta"] == requests, served
    assert served["gamma"] == 0
    tolerance = binomial_tolerance(requests, share, FALSE_FAILURE)
    print(f"\n{h.adapter.kind}: 70/30 over {requests} requests -> alpha {served['alpha']}, "
          f"beta {served['beta']} (expected alpha {requests * share:.1f} ± {tolerance:.1f})")
    assert abs(served["alpha"] - requests * share) <= tolerance


def zero_weight_applies_to_the_next_request(h: Harness) -> None:
    h.apply(route({"alpha": 7000, "beta": 3000}))
    h.apply(route({"alpha": 10000, "beta": 0}, revision=2))
    client = h.client()
    before = h.served()
    for _ in range(20):
        ask(client)
    assert h.served_since(before) == {"alpha": 20, "beta": 0, "gamma": 0}


def in_flight_stream_finishes_after_drain(h: Harness) -> None:
    """A stream open on beta when beta is drained keeps going to its natural end; the next
    request goes to alpha; in_flight(beta) sees the stream, then sees it end."""
    h.apply(route({"alpha": 0, "beta": 10000}))
    client = h.client()
    # 100 ms per token: 60 tokens take ~6 s, time enough for the apply and the request below
    # to happen while the stream is still open, even on a loaded machine.
    with slowed(h.sim, "beta", 50):
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "tell me a story"}],
            max_tokens=60, stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        first = [next(chunks) for _ in range(3)]
        assert h.adapter.in_flight("beta") == 1
        result = h.apply(route({"alpha": 10000, "beta": 0}, revision=2))
        before = h.served()
        assert ask(client) in ("length", "stop")
        assert h.served_since(before) == {"alpha": 1, "beta": 0, "gamma": 0}
        assert h.adapter.in_flight("beta") == 1, "the drained pool's stream is still open"
        rest = list(chunks)
    tokens = [c for c in first + rest if c.choices and c.choices[0].delta.content]
    assert len(tokens) == 60
    assert rest[-1].choices[0].finish_reason == "length"
    assert wait_until(lambda: h.adapter.in_flight("beta") == 0)
    print(f"\n{h.adapter.kind}: drain applied while streaming: {result.method}: {result.detail}")


def residency_fails_closed(h: Harness) -> None:
    unpinned = route({"alpha": 10000})
    pinned = route({"gamma": 10000}, key="chat-in", residency="IN")
    h.apply(unpinned, pinned)
    before = h.served()
    ask(h.client(**{RESIDENCY: "IN"}))
    ask(h.client())
    assert h.served_since(before) == {"alpha": 1, "beta": 0, "gamma": 1}

    before = h.served()
    refused = error_of(lambda: ask(h.client(**{RESIDENCY: "EU"})))
    assert refused.status_code == 403
    assert "residency_unavailable" in str(refused.body)
    combined = error_of(lambda: ask(h.client(**{RESIDENCY: "IN,EU"})))
    assert combined.status_code == 403
    assert h.served_since(before) == {"alpha": 0, "beta": 0, "gamma": 0}

    # The pinned route loses its last pool: it answers an error, never the unpinned pools.
    h.apply(unpinned, route({}, key="chat-in", residency="IN", revision=2))
    before = h.served()
    empty = error_of(lambda: ask(h.client(**{RESIDENCY: "IN"})))
    assert empty.status_code == 503
    assert "no_pool_available" in str(empty.body)
    assert h.served_since(before) == {"alpha": 0, "beta": 0, "gamma": 0}


def unknown_model_is_refused(h: Harness) -> None:
    h.apply(route({"alpha": 10000}))
    before = h.served()
    with pytest.raises(openai.NotFoundError) as caught:
        ask(h.client(), model="no-such-model")
    assert "model_not_found" in str(caught.value.body)
    assert h.served_since(before) == {"alpha": 0, "beta": 0, "gamma": 0}


def oversized_body_is_refused(h: Harness) -> None:
    """The model is read from the body, so a body too large to hold is refused, not guessed."""
    h.apply(route({"alpha": 10000}))
    big = {"model": MODEL, "messages": [{"role": "user", "content": "word " * 400_000}]}
    answer = httpx.post(f"{h.url}/v1/chat/completions", json=big, timeout=30)
    assert answer.status_code == 413
    assert answer.json()["error"]["code"] == "too_large"


def read_back_equals_desired(h: Harness) -> None:
    for weights in ({"alpha": 7000, "beta": 3000}, {"alpha": 1, "beta": 9999}, {"beta": 10000}):
        desired = h.desired(route(weights), route({"gamma": 10000}, key="chat-in",
                                                  residency="IN"))
        h.adapter.apply(desired)
        held = h.adapter.read_back()
        assert h.adapter.matches(desired, held), (weights, held)
        assert held["chat-in"] == {"gamma": 10000}
        assert set(held["chat"]) == {p for p, w in weights.items() if w}


def failed_validation_keeps_the_previous_config(h: Harness) -> None:
    """A pool whose address does not resolve passes fleetctl's checks but not the gateway's
    own (`haproxy -c` / `nginx -t`): the push fails for good and the old config serves on."""
    h.apply(route({"alpha": 10000}))
    held = h.adapter.read_back()
    unresolvable = PoolTarget(name="delta", base_urls=("http://no-such-pool.invalid:8000",),
                              jurisdiction="US")
    broken = DesiredState(routes=(route({"alpha": 5000, "delta": 5000}, revision=2),),
                          pools={**h.pools(), "delta": unresolvable})
    with pytest.raises(AdapterError) as caught:
        h.adapter.apply(broken)
    assert caught.value.permanent
    assert "no-such-pool.invalid" in str(caught.value)
    assert h.adapter.read_back() == held
    before = h.served()
    ask(h.client())
    assert h.served_since(before)["alpha"] == 1


def apply_is_refused_quickly_when_the_gateway_is_down(adapter: Adapter,
                                                      desired: DesiredState) -> None:
    took = []
    for call in (lambda: adapter.apply(desired), adapter.read_back,
                 lambda: adapter.in_flight("alpha")):
        started = time.monotonic()
        with pytest.raises(AdapterError) as caught:
            call()
        assert not caught.value.permanent
        took.append(time.monotonic() - started)
    print(f"\n{adapter.kind}: refused in " + ", ".join(f"{t * 1000:.0f} ms" for t in took))
    assert max(took) < 2.5


def apply_timings(h: Harness, runs: int = 20) -> dict[str, list[float]]:
    """Apply times in ms, weights-only and structural (a route added and removed); the
    medians are printed."""
    base = route({"alpha": 5000, "beta": 5000})
    h.apply(base)
    weights_only, structural = [], []
    for n in range(runs):
        share = 3000 + 100 * (n % 20)
        started = time.monotonic()
        h.apply(route({"alpha": share, "beta": 10000 - share}, revision=n + 2))
        weights_only.append((time.monotonic() - started) * 1000)
    for n in range(runs):
        extra = (route({"gamma": 10000}, key="chat-in", residency="IN"),) if n % 2 == 0 else ()
        started = time.monotonic()
        h.apply(base, *extra)
        structural.append((time.monotonic() - started) * 1000)
    print(f"\n{h.adapter.kind}: median apply over {runs} runs: weights-only "
          f"{statistics.median(weights_only):.1f} ms, structural "
          f"{statistics.median(structural):.1f} ms")
    return {"weights-only": weights_only, "structural": structural}


def reloads_under_load_lose_no_request(h: Harness, reloads: int = 6) -> None:
    """Structural changes (a reload each) while requests keep coming: none of them fails."""
    base = route({"alpha": 5000, "beta": 5000})
    h.apply(base)
    stop, errors, answered = threading.Event(), [], [0]

    def load() -> None:
        client = h.client()
        while not stop.is_set():
            try:
                ask(client)
                answered[0] += 1
            except openai.OpenAIError as exc:
                errors.append(repr(exc))

    def finished(count: int) -> bool:
        return answered[0] + len(errors) >= count

    workers = [threading.Thread(target=load) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        for n in range(reloads):
            # Requests are flowing before each reload (some finished since the last one),
            # rather than a fixed pause that a loaded machine may not fill.
            more = answered[0] + len(errors) + 4
            assert wait_until(functools.partial(finished, more)), "no requests are finishing"
            extra = (route({"gamma": 10000}, key="chat-in", residency="IN"),) if n % 2 == 0 \
                else ()
            assert h.apply(base, *extra).method == "reload"
    finally:
        stop.set()
        for worker in workers:
            worker.join()
    assert errors == [], errors[:3]
    assert answered[0] > reloads
