"""The snapshot store's bookkeeping, driven as the ADS server drives it (sent, answered,
opened, closed); tests/traffic/envoy/test_xds.py drives it with real Envoys."""

from __future__ import annotations

import threading

import pytest

from fleetctl.traffic.gateways.envoy.names import CLUSTER_TYPE, ROUTE_CONFIG_TYPE, RUNTIME_TYPE
from fleetctl.xds.resources import TypeResources
from fleetctl.xds.store import MemoryStore

TYPES = (CLUSTER_TYPE, ROUTE_CONFIG_TYPE, RUNTIME_TYPE)


def types(weights: str, routes: str = "r1") -> dict[str, TypeResources]:
    return {CLUSTER_TYPE: TypeResources("c1", ()), ROUTE_CONFIG_TYPE: TypeResources(routes, ()),
            RUNTIME_TYPE: TypeResources(weights, ())}


def deliver(store: MemoryStore, node: str, nonce: int, *, error: str | None = None,
            only: tuple[str, ...] = TYPES) -> None:
    """What a stream does for the gateway's current snapshot: send each type, then the
    Envoy's answer to it."""
    snapshot = store.snapshot("gw")
    for type_url in only:
        store.sent("gw", node, type_url, f"{nonce}-{type_url}", snapshot.version(type_url),
                   snapshot.number)
        store.answered("gw", node, type_url, f"{nonce}-{type_url}", error)


def test_every_connected_envoy_must_ack_and_a_gone_one_is_not_waited_for() -> None:
    store = MemoryStore()
    for node in ("e1", "e2"):
        store.stream_opened("gw", node)
    first = store.set_snapshot("gw", types("w1"), meta="first")
    deliver(store, "e1", 1)
    waiting = store.wait_acked("gw", first.number, timeout_s=0.05)
    assert waiting.timed_out and not waiting.ok
    assert {e.node_id: e.state for e in waiting.envoys} == {"e1": "acked", "e2": "pending"}
    assert store.held_meta("gw") is None  # e2 holds nothing of ours

    stream = store.envoys("gw")[1].stream
    store.stream_closed("gw", "e2", stream)
    result = store.wait_acked("gw", first.number, timeout_s=5)
    assert result.ok and [e.node_id for e in result.envoys] == ["e1"]
    assert store.held_meta("gw") == (first.number, "first")
    assert [e.connected for e in store.envoys("gw")] == [True, False]
    assert store.any_connected("gw")
    store.stream_closed("gw", "e1", store.envoys("gw")[0].stream)
    assert not store.any_connected("gw") and not store.any_connected("other")


def test_a_nack_fails_the_wait_with_envoys_message_and_keeps_the_ack_it_had() -> None:
    store = MemoryStore()
    store.stream_opened("gw", "e1")
    good = store.set_snapshot("gw", types("w1"), meta="good")
    deliver(store, "e1", 1)
    bad = store.set_snapshot("gw", types("w1", routes="r-bad"), meta="bad")
    deliver(store, "e1", 2, only=(ROUTE_CONFIG_TYPE,), error="invalid route")
    result = store.wait_acked("gw", bad.number, timeout_s=5)
    assert not result.ok and not result.timed_out
    assert [(e.node_id, e.error) for e in result.nacked] == [("e1", "RDS: invalid route")]
    assert store.held_meta("gw") == (good.number, "good")
    # A later snapshot that keeps the refused routes is refused too, without a resend.
    later = store.set_snapshot("gw", types("w2", routes="r-bad"))
    assert store.wait_acked("gw", later.number, timeout_s=5).nacked


def test_a_wait_wakes_when_the_ack_arrives_from_another_thread() -> None:
    store = MemoryStore()
    store.stream_opened("gw", "e1")
    snapshot = store.set_snapshot("gw", types("w1"))
    # Whichever comes first, the wait or the ACK, the wait ends well before its timeout.
    answering = threading.Thread(target=deliver, args=(store, "e1", 1))
    answering.start()
    assert store.wait_acked("gw", snapshot.number, timeout_s=30).ok
    answering.join()


def test_a_later_snapshot_acked_counts_for_an_earlier_one() -> None:
    store = MemoryStore()
    store.stream_opened("gw", "e1")
    first = store.set_snapshot("gw", types("w1"))
    store.set_snapshot("gw", types("w2"))
    deliver(store, "e1", 1)
    assert store.wait_acked("gw", first.number, timeout_s=1).ok


def test_a_reconnected_envoy_holds_nothing_until_it_acks_again() -> None:
    store = MemoryStore()
    store.stream_opened("gw", "e1")
    snapshot = store.set_snapshot("gw", types("w1"))
    deliver(store, "e1", 1)
    store.stream_opened("gw", "e1")
    assert store.wait_acked("gw", snapshot.number, timeout_s=0.01).timed_out
    deliver(store, "e1", 2)
    assert store.wait_acked("gw", snapshot.number, timeout_s=1).ok


def test_bad_input_is_refused_and_changes_nothing() -> None:
    store = MemoryStore()
    with pytest.raises(ValueError, match="missing: RTDS"):
        store.set_snapshot("gw", {CLUSTER_TYPE: TypeResources("c", ()),
                                  ROUTE_CONFIG_TYPE: TypeResources("r", ())})
    with pytest.raises(ValueError, match="needs a gateway"):
        store.set_snapshot("", types("w1"))
    assert store.snapshot("gw").number == 0
    with pytest.raises(ValueError, match="has no snapshot 7"):
        store.wait_acked("gw", 7, timeout_s=0)
    # An answer to a nonce never sent (stale, or another stream's) is ignored.
    store.stream_opened("gw", "e1")
    store.answered("gw", "e1", CLUSTER_TYPE, "nope", "boom")
    assert store.envoys("gw")[0].types[CLUSTER_TYPE].error == ""
