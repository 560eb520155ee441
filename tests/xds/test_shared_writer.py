"""A replica's writer (fleetctl/xds/shared.py) writes what its streams report in batches: the
sent/ACK/NACK reports between two opens or closes in a few statements. The rows must be the
ones writing each report on its own gives, and a push to many Envoys must not cost a statement
per report."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from fleetctl.xds.models import XdsReplica, XdsTypeAck
from fleetctl.xds.shared import REPLICA_GONE_S, SharedStore, envoy_states

pytestmark = pytest.mark.django_db

CDS = "type.googleapis.com/envoy.config.cluster.v3.Cluster"
RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"
RTDS = "type.googleapis.com/envoy.service.runtime.v3.Runtime"


def reports(gateway: str) -> list[tuple[Any, ...]]:
    now = timezone.now()
    return [
        ("open", gateway, "e0", 1, now, ""), ("open", gateway, "e1", 2, now, ""),
        ("sent", gateway, "e0", 1, CDS, "c1", 1), ("sent", gateway, "e1", 2, CDS, "c1", 1),
        ("sent", gateway, "e0", 1, RDS, "r1", 1),
        ("answer", gateway, "e0", 1, CDS, "c1", 1, None),
        ("answer", gateway, "e1", 2, CDS, "c1", 1, "bad cluster"),
        ("sent", gateway, "e0", 1, CDS, "c2", 2),
        ("answer", gateway, "e0", 1, CDS, "c2", 2, None),
        ("answer", gateway, "e0", 1, CDS, "c1", 1, None),  # late: never moves it back
        ("answer", gateway, "e0", 1, RDS, "r1", 1, None),
        ("answer", gateway, "e0", 9, RDS, "r9", 9, None),  # a stream never opened here
        ("close", gateway, "e1", 2, now),
        ("sent", gateway, "e0", 1, RTDS, "w1", 1),
        ("answer", gateway, "e0", 1, RTDS, "w1", 1, None),
    ]


def rows(gateway: str) -> list[tuple[Any, ...]]:
    return [(e.node_id, e.connected, e.stream, type_url, sorted(vars(ack).items()))
            for e in envoy_states(gateway) for type_url, ack in sorted(e.types.items())]


def test_reports_written_together_are_the_rows_written_one_by_one() -> None:
    store = SharedStore(replica="r1")
    store._write_batch(reports("together"), {}, beat_due=True)
    one_by_one: dict[tuple[str, str, int], int] = {}
    for op in reports("apart"):
        store._write_batch([op], one_by_one, beat_due=False)
    assert rows("together") == rows("apart")
    assert len(rows("together")) == 4  # e0: CDS, RDS, RTDS; e1: CDS
    e0 = {t: a for e in envoy_states("together") if e.node_id == "e0"
          for t, a in e.types.items()}
    assert (e0[CDS].acked_version, e0[CDS].acked_number, e0[RTDS].acked_version) \
        == ("c2", 2, "w1")


def test_reports_of_a_stream_another_replica_took_over_are_not_written() -> None:
    mine, other = SharedStore(replica="r1"), SharedStore(replica="r2")
    envoys: dict[tuple[str, str, int], int] = {}
    mine._write_batch([("open", "g", "e0", 1, timezone.now(), "")], envoys, beat_due=False)
    other._write_batch([("open", "g", "e0", 5, timezone.now(), "")], {}, beat_due=False)
    mine._write_batch([("sent", "g", "e0", 1, CDS, "c1", 1),
                       ("answer", "g", "e0", 1, CDS, "c1", 1, None)], envoys, beat_due=False)
    assert not XdsTypeAck.objects.filter(envoy__gateway="g").exists()
    assert envoys == {}  # forgotten: its later reports are not even looked at


def test_a_push_to_many_envoys_is_written_in_a_few_statements() -> None:
    store = SharedStore(replica="r1")
    envoys: dict[tuple[str, str, int], int] = {}
    store._write_batch([("open", "g", f"e{i}", i, timezone.now(), "") for i in range(50)], envoys,
                       beat_due=False)
    push = ([("sent", "g", f"e{i}", i, RTDS, "w1", 1) for i in range(50)]
            + [("answer", "g", f"e{i}", i, RTDS, "w1", 1, None) for i in range(50)])
    with CaptureQueriesContext(connection) as captured:
        store._write_batch(push, envoys, beat_due=False)
    # the transaction (a savepoint here) and SET LOCAL, the rows locked, sent, ACKed
    assert len(captured) <= 6, [q["sql"][:80] for q in captured.captured_queries]
    assert XdsTypeAck.objects.filter(envoy__gateway="g", acked_number=1).count() == 50


def test_any_connected_says_what_the_envoys_rows_say() -> None:
    store = SharedStore(replica="r1")
    envoys: dict[tuple[str, str, int], int] = {}
    assert not store.any_connected("g")
    store._write_batch([("open", "g", "e0", 1, timezone.now(), "")], envoys, beat_due=True)
    assert store.any_connected("g") and [e.connected for e in store.envoys("g")] == [True]
    XdsReplica.objects.filter(name="r1").update(
        heartbeat_at=timezone.now() - timedelta(seconds=REPLICA_GONE_S + 1))
    assert not store.any_connected("g") and [e.connected for e in store.envoys("g")] == [False]
    store._write_batch([("close", "g", "e0", 1, timezone.now())], envoys, beat_due=True)
    assert not store.any_connected("g") and [e.connected for e in store.envoys("g")] == [False]
    assert not store.any_connected("other")
