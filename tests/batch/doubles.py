"""Test doubles of the checkpoint store, each with one deliberate bug, for checking that the
drill fails honestly when resume is broken. The bugs live here, never in fleetctl/: a worker
runs with one through `python -m fleetctl.batch.worker --store tests.batch.doubles:Class`.
"""

from __future__ import annotations

from django.db import transaction

from fleetctl.batch.models import BatchChunk, BatchJob
from fleetctl.batch.store import CheckpointStore, Claim


class SkipsInFlightStore(CheckpointStore):
    """BUG: resumes "after the checkpoint". At a takeover it treats the requests that were in
    flight at the kill (dispatched, no result) as done and does not send them again, and its
    finish trusts the claim instead of counting the result rows. The job completes with those
    requests missing: the drill must fail, naming them."""

    def claim(self, owner: str) -> Claim | None:
        claim = super().claim(owner)
        if claim is not None and claim.resent:
            skipped = set(claim.resent)
            claim.pending = [i for i in claim.pending if i not in skipped]
        return claim

    def finish(self, claim: Claim) -> str:
        with transaction.atomic():
            job = BatchJob.objects.select_for_update().get(pk=claim.job_id)
            if not BatchChunk.objects.filter(
                    pk=claim.chunk_id, lease_owner=claim.owner,
                    state=BatchChunk.State.RUNNING).update(state=BatchChunk.State.DONE,
                                                           lease_until=None):
                return "released"
            if not BatchChunk.objects.filter(job_id=claim.job_id).exclude(
                    state=BatchChunk.State.DONE).exists():
                self._complete(job, claim.owner)
        return "done"


class NeverTakesOverStore(CheckpointStore):
    """BUG: never takes over a lapsed lease (only pending chunks are claimed): a chunk whose
    holder was killed stays stuck, so no other worker resumes the work."""

    def claim(self, owner: str) -> Claim | None:
        lapsed = BatchChunk.objects.filter(state=BatchChunk.State.RUNNING)
        if lapsed.filter(job__state=BatchJob.State.RUNNING).exists():
            return None  # a running chunk exists: this store waits for it forever
        return super().claim(owner)
