from __future__ import annotations

from fleetctl.bench import services
from fleetctl.celery import app


@app.task(name="bench.run", ignore_result=True, acks_late=False, soft_time_limit=6 * 3600,
          time_limit=6 * 3600 + 60)
def run_execute(run_id: int) -> None:
    """Coordinate one benchmark run (it also drives shard 0 of every level)."""
    services.run_execute(run_id=run_id)


@app.task(name="bench.shard", ignore_result=True, soft_time_limit=3600, time_limit=3660)
def shard(level_id: int, shard_index: int, concurrency: int, start_at: float) -> None:
    """One more client process's share of a level (scale-out over bench workers)."""
    services.shard_execute(level_id=level_id, shard=shard_index, concurrency=concurrency,
                           start_at=start_at)


@app.task(name="bench.reap", ignore_result=True)
def reap() -> int:
    """Beat: fail runs whose coordinator stopped beating (never left "running")."""
    return services.runs_reap()
