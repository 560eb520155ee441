"""The ACK reports a replica publishes ahead of its commit, as a pushing process applies
them to the rows it read (fleetctl/xds/shared.py, `wait_acked`)."""

from __future__ import annotations

from fleetctl.xds.shared import _apply_report
from fleetctl.xds.store import EnvoyState, TypeAck

RDS = "type.googleapis.com/envoy.config.route.v3.RouteConfiguration"


def live() -> dict[str, EnvoyState]:
    return {n: EnvoyState(node_id=n, gateway="g", replica="r1", stream=7,
                          types={RDS: TypeAck(acked_version="v3", acked_number=3)})
            for n in ("e0", "e1")}


def test_an_ack_counts_on_the_stream_the_row_names_and_only_forward() -> None:
    envoys = live()
    _apply_report(envoys, {"replica": "r1", "closed": [], "acks": [
        ["e0", 7, RDS, "v5", 5, None],  # its live stream: held
        ["e1", 8, RDS, "v5", 5, None],  # a newer stream the rows do not name yet: not yet
    ]})
    assert (envoys["e0"].types[RDS].acked_number, envoys["e0"].types[RDS].acked_version) \
        == (5, "v5")
    assert envoys["e1"].types[RDS].acked_number == 3
    _apply_report(envoys, {"replica": "r1", "acks": [["e0", 7, RDS, "v4", 4, None]]})
    assert envoys["e0"].types[RDS].acked_number == 5  # a late ACK of an older one
    _apply_report(envoys, {"replica": "r2", "acks": [["e1", 7, RDS, "v5", 5, None]]})
    assert envoys["e1"].types[RDS].acked_number == 3  # another replica's stream 7


def test_a_nack_is_recorded_with_envoys_message_and_a_closed_stream_is_not_waited_for(
) -> None:
    envoys = live()
    _apply_report(envoys, {"replica": "r1", "acks": [["e0", 7, RDS, "v5", 5, "bad route"]],
                           "closed": [["e1", 7]]})
    ack = envoys["e0"].types[RDS]
    assert (ack.nacked_number, ack.nacked_version, ack.error, ack.acked_number) == \
        (5, "v5", "bad route", 3)
    assert list(envoys) == ["e0"]
    _apply_report(envoys, {"replica": "r1", "closed": [["e0", 6]]})  # an older stream
    assert list(envoys) == ["e0"]
