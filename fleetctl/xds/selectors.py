"""Reads of the xDS app for pages: the Envoys of each gateway and where each stands."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from fleetctl.xds.protos import SERVED_TYPES
from fleetctl.xds.shared import envoy_states, snapshot_history


@dataclass(frozen=True)
class EnvoyView:
    node_id: str
    replica: str
    # "current": ACKed the gateway's current snapshot (every type); "stale": connected,
    # holding an older one (or none yet); "refused": NACKed the current one; "gone"
    state: str
    acked: int | None  # the snapshot number it holds for every type (None: none)
    current: int  # the gateway's current snapshot number (0: fleetctl set none)
    since: datetime  # connected at, or gone at
    error: str = ""


def gateway_envoys(*, gateways: Iterable[str]) -> dict[str, list[EnvoyView]]:
    """Gateway name -> its Envoys as every xDS replica recorded them, connected ones first.
    A stale Envoy is never counted as holding the current snapshot."""
    out: dict[str, list[EnvoyView]] = {}
    for name in gateways:
        history = snapshot_history(name, meta=False)
        current = history[-1] if history else None
        views = []
        for envoy in envoy_states(name):
            numbers = [envoy.types[t].acked_number if t in envoy.types else -1
                       for t in SERVED_TYPES]
            acked = min(numbers) if min(numbers) >= 0 else None
            error = ""
            if not envoy.connected:
                state = "gone"
            elif current is None:
                state = "current" if acked is not None else "stale"
            elif all(envoy.holds(current, t) for t in SERVED_TYPES):
                state = "current"
            elif any(envoy.refused(current, t) for t in SERVED_TYPES):
                state = "refused"
                error = "; ".join(envoy.types[t].error for t in SERVED_TYPES
                                  if envoy.refused(current, t))
            else:
                state = "stale"
            when = envoy.connected_at if envoy.connected else (envoy.gone_at or 0.0)
            views.append(EnvoyView(node_id=envoy.node_id, replica=envoy.replica, state=state,
                                   acked=acked, current=current.number if current else 0,
                                   since=datetime.fromtimestamp(when, tz=UTC), error=error))
        views.sort(key=lambda v: (v.state == "gone", v.node_id))
        out[name] = views
    return out
