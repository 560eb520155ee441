"""The shared xDS store's records as the routes page shows them: an envoy-xds gateway lists
its Envoys, ACKed, stale (connected, holding an older snapshot), refused or gone. The
records are written as an xDS replica writes them (its store's writer thread), driven here
the way its ADS streams drive it; the real streams are tests/traffic/envoy/test_xds_replicas.py.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from django.test import Client
from django.urls import reverse

from fleetctl.traffic import services
from fleetctl.xds.protos import SERVED_TYPES
from fleetctl.xds.resources import from_documents
from fleetctl.xds.selectors import gateway_envoys
from fleetctl.xds.shared import SharedStore
from tests.support.waiting import wait_until
from tests.traffic.web.conftest import SYSTEM

pytestmark = pytest.mark.django_db(transaction=True)

GW = "gw-xds-page"


def documents(weights: str) -> dict[str, str]:
    """The three discovery documents of a snapshot, nothing in them but versions."""
    return {t: f'{{"version_info": "{weights if i == 2 else f"v{i}"}", "resources": []}}'
            for i, t in enumerate(SERVED_TYPES)}


def deliver(store: SharedStore, node: str, nonce: str, *, error: str | None = None) -> None:
    """What a stream does with the gateway's current snapshot: send it, get an answer."""
    snapshot = store.snapshot(GW)
    for type_url in SERVED_TYPES:
        store.sent(GW, node, type_url, f"{nonce}-{type_url}", snapshot.version(type_url),
                   snapshot.number)
        store.answered(GW, node, type_url, f"{nonce}-{type_url}", error)


@pytest.fixture
def store() -> Iterator[SharedStore]:
    store = SharedStore(replica="replica-a")
    yield store
    store.stop()


def test_the_page_lists_acked_stale_refused_and_gone_envoys(
        store: SharedStore, viewer: Client) -> None:
    services.gateway_create(actor=SYSTEM, name=GW, kind="envoy-xds",
                            admin_address="http://127.0.0.1:19901")
    streams = {node: store.stream_opened(GW, node) for node in ("e1", "e2", "e3", "e4")}
    first = store.set_snapshot(GW, from_documents(documents("w1")), {"n": 1})
    for node in ("e1", "e2", "e3", "e4"):
        deliver(store, node, f"a-{node}")
    second = store.set_snapshot(GW, from_documents(documents("w2")), {"n": 2})
    deliver(store, "e1", "b-e1")
    deliver(store, "e3", "b-e3", error="no such cluster")
    store.stream_closed(GW, "e4", streams["e4"])

    refused = store.wait_acked(GW, second.number, timeout_s=30)
    assert [(e.node_id, e.state) for e in refused.envoys] == [
        ("e1", "acked"), ("e2", "pending"), ("e3", "nacked")]
    assert "no such cluster" in refused.nacked[0].error
    assert store.wait_acked(GW, first.number, timeout_s=30).ok  # every live one holds #1+
    assert store.held_meta(GW) == (first.number, {"n": 1})

    wait_until(lambda: [v.state for v in gateway_envoys(gateways=[GW])[GW]]
               == ["current", "stale", "refused", "gone"], what="the records to be written")
    views = {v.node_id: v for v in gateway_envoys(gateways=[GW])[GW]}
    assert (views["e2"].acked, views["e2"].current) == (first.number, second.number)
    assert views["e1"].replica == "replica-a"

    page = viewer.get(reverse("traffic:routes")).content.decode()
    assert f"ACKed #{second.number}" in page
    assert f"stale: holds #{first.number} of #{second.number}" in page
    assert f"refused #{second.number}" in page and "no such cluster" in page
    assert "gone" in page


def test_a_reconnected_envoy_holds_nothing_until_it_acks_again(store: SharedStore) -> None:
    store.stream_opened(GW, "e1")
    snapshot = store.set_snapshot(GW, from_documents(documents("w1")), None)
    deliver(store, "e1", "a")
    assert store.wait_acked(GW, snapshot.number, timeout_s=30).ok
    # The same node on a new stream (another replica's, or this one's): nothing held yet.
    other = SharedStore(replica="replica-b")
    try:
        other.stream_opened(GW, "e1")
        wait_until(lambda: [e.replica for e in other.envoys(GW)] == ["replica-b"],
                   what="the new stream's record")
        assert not store.wait_acked(GW, snapshot.number, timeout_s=0.1).ok
        # The old replica's close of its stream does not mark the Envoy gone.
        store.stream_closed(GW, "e1", 1)
        deliver(other, "e1", "b")
        assert store.wait_acked(GW, snapshot.number, timeout_s=30).ok
        assert [e.connected for e in store.envoys(GW)] == [True]
    finally:
        other.stop()


def test_bad_input_changes_nothing(store: SharedStore) -> None:
    with pytest.raises(ValueError, match="missing: RTDS"):
        store.set_snapshot(GW, {t: r for t, r in from_documents(documents("w")).items()
                                if t != SERVED_TYPES[2]})
    with pytest.raises(ValueError, match="has no snapshot 7"):
        store.wait_acked(GW, 7, timeout_s=0.1)
    assert store.snapshot(GW).number == 0  # unconfigured


def test_one_push_of_a_gateway_at_a_time_across_stores(store: SharedStore) -> None:
    other = SharedStore(replica="another-process")
    try:
        with store.push_lock(GW, timeout_s=30):
            with (pytest.raises(TimeoutError, match=f"another push of gateway {GW}"),
                  other.push_lock(GW, timeout_s=0.2)):
                pass
            with other.push_lock(f"{GW}-b", timeout_s=0.2):  # another gateway: free
                pass
        with other.push_lock(GW, timeout_s=0.2):  # released
            pass
    finally:
        other.stop()
