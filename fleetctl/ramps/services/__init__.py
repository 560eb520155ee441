"""Writes for ramps: a person starts, pauses, resumes, skips or aborts one; the controller
(`ramps_tick`, beat every RAMP_TICK_INTERVAL_S) drives each running ramp one step at a time.

The controller keeps no state of its own: a tick claims a ramp with a conditional UPDATE of
its lease (free or expired), does one step of the state machine from the ramp's rows, and
releases it. A worker killed mid-tick leaves a lease that expires after RAMP_LEASE_S, and the
next tick takes over. Splits change only through traffic's own services (`revision_create`,
`drain_request` + `push.drain_push_now`), so every rule of a split (residency, health,
live-weight guards, the stale-revision check) holds for a ramp exactly as for a person, and
a ramp never fights a manual change: another revision on the route pauses it.

`people` holds what a person does, `controller` what the beat and the drains do, `_shared`
what both use. Import them from here: `from fleetctl.ramps import services`."""

from __future__ import annotations

from fleetctl.ramps.services._shared import (
    DEFAULT_LATENCY_MARGIN_PCT,
    MAX_STEPS,
    NOTIFIED,
    THRESHOLD_FIELDS,
    Kind,
    thresholds_of,
)
from fleetctl.ramps.services.controller import (
    ramps_end_for_drain,
    ramps_lock_for_drain,
    ramps_tick,
    record_error,
    split_for,
    step_data_start,
)
from fleetctl.ramps.services.people import (
    ramp_abort,
    ramp_create,
    ramp_pause,
    ramp_resume,
    ramp_skip,
    ramps_hold_for_report,
)
from fleetctl.ramps.services.watch import (
    watch_end,
    watch_set_policy,
    watch_tick,
    watches_hand_over,
)

__all__ = [
    "DEFAULT_LATENCY_MARGIN_PCT",
    "MAX_STEPS",
    "NOTIFIED",
    "THRESHOLD_FIELDS",
    "Kind",
    "ramp_abort",
    "ramp_create",
    "ramp_pause",
    "ramp_resume",
    "ramp_skip",
    "ramps_end_for_drain",
    "ramps_hold_for_report",
    "ramps_lock_for_drain",
    "ramps_tick",
    "record_error",
    "split_for",
    "step_data_start",
    "thresholds_of",
    "watch_end",
    "watch_set_policy",
    "watch_tick",
    "watches_hand_over",
]
