"""Writes for shadow runs: start, adjust and stop a run, execute one sampled request (the
`shadow.pair` task), replay a trace (`shadow.replay`), judge a run (beat `shadow.judge`) and
purge stored text past its retention (beat `shadow.purge`).

A mirror run asks traffic to have the route's gateways copy a share of its requests to the
shadow collector (route_mirror_set: traffic owns the route, and checks the pools against its
residency pin) and publishes the run in Redis (live.publish_run) so the collector knows whose
requests they are. Stopping is one action: unpublished first (the collectors stop within a
second), the mirror cleared, the run stopped. A worker that finds a pool outside the route's
pin stops the run itself: it fails closed.

Every sampled request becomes a ShadowPair: three answers (primary, secondary, candidate) and
two comparisons (noise = primary vs secondary, signal = primary vs candidate). Text is stored
only as the run's content policy allows; with content "off" no column holds any of it.

`people` holds what a person does to a run, `pairs` and `judging` what the workers and beat
do, `_shared` what both use. Import them from here: `from fleetctl.shadow import services`."""

from __future__ import annotations

from fleetctl.shadow.services._shared import PRODUCER
from fleetctl.shadow.services.judging import (
    EVIDENCE_EVERY_S,
    EVIDENCE_VERDICT,
    LIVE_QUALITY_KIND,
    judged_sequence,
    pairs_purge,
    pool_changed,
    publications_reconcile,
    run_judge,
    runs_judge,
)
from fleetctl.shadow.services.pairs import (
    REPLAY_CONCURRENCY,
    REPLAY_POLL_S,
    pair_execute,
    replay_body,
    replay_execute,
    request_hash,
)
from fleetctl.shadow.services.people import ADJUSTABLE, run_adjust, run_create, run_stop

__all__ = [
    "ADJUSTABLE",
    "EVIDENCE_EVERY_S",
    "EVIDENCE_VERDICT",
    "LIVE_QUALITY_KIND",
    "PRODUCER",
    "REPLAY_CONCURRENCY",
    "REPLAY_POLL_S",
    "judged_sequence",
    "pair_execute",
    "pairs_purge",
    "pool_changed",
    "publications_reconcile",
    "replay_body",
    "replay_execute",
    "request_hash",
    "run_adjust",
    "run_create",
    "run_judge",
    "run_stop",
    "runs_judge",
]
