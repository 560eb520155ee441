"""Shadow tasks (thin: the work is in services). `shadow.pair` and `shadow.replay` run on the
`shadow` queue, `shadow.judge` and `shadow.purge` on `default` (fleetctl/celery.py)."""

from __future__ import annotations

from typing import Any

from fleetctl.celery import app
from fleetctl.shadow import services


@app.task(name="shadow.pair", ignore_result=True, acks_late=False)
def pair(run_id: int, request: Any, received_at: str | None = None,
         source: str = "mirror") -> None:
    """One sampled request to the primary, the secondary and the candidate, compared and
    stored. Not acknowledged late: a pair redelivered after a worker died would be sent to
    the three sides a second time, and a lost sample costs nothing."""
    services.pair_execute(run_id=run_id, request=request, received_at=received_at,
                          source=source)


@app.task(name="shadow.replay", ignore_result=True, acks_late=False)
def replay(run_id: int) -> None:
    """Replay the run's trace at its own timing, then judge the run and finish it."""
    services.replay_execute(run_id=run_id)


@app.task(name="shadow.judge", ignore_result=True)
def judge() -> int:
    """Beat: judge every running run (judgement row, counters, evidence when due)."""
    return services.runs_judge()


@app.task(name="shadow.purge", ignore_result=True)
def purge() -> int:
    """Beat: empty the stored text of pairs past their run's retention."""
    return services.pairs_purge()
