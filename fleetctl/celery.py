"""The one Celery app. Queues, routes, limits and the beat schedule are declared here only.

Queues by concern, each consumed by a worker of its own (docs/queues.md), so no kind of task
waits behind another:

- `push`: gateway pushes and what drives them (push_run, push_fanout, converge, reconcile).
  Short tasks: one attempt each, nothing waits inside a `push` thread.
- `watch`: looks that follow something for minutes (a drain's watcher, a rehearsal waiting
  for its drain). They never take a push thread.
- `probe`: pool health probes and gateway traffic samples, on a fixed beat; never behind a
  benchmark. Conformance probe runs too (short: a few dozen requests per endpoint).
- `bench`: benchmark runs and their shards, which hold a slot for hours.
- `shadow`: shadow pairs (one sampled request sent to primary, secondary and candidate) and
  trace replays; never behind a benchmark, never in front of a push.
- `evals`: eval runs (one task drives a run's items on its own thread pool for minutes);
  never behind a benchmark, never in front of shadow pairs.
- `default`: everything else (plan refresh, prunes, the benchmark reaper).

Every task is routed by its name (ROUTES); a new task must be given a queue there.
"""

from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_ready
from kombu import Queue

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "fleetctl.settings")

app = Celery("fleetctl")
app.config_from_object("django.conf:settings", namespace="CELERY")

QUEUES = ("push", "watch", "probe", "bench", "shadow", "evals", "default")

ROUTES: dict[str, str] = {
    "traffic.push_run": "push",
    "traffic.push_fanout": "push",
    "traffic.converge": "push",
    "traffic.reconcile": "push",
    "traffic.drain_watch": "watch",
    "plans.rehearsal_finish": "watch",
    "fleet.pools_probe_due": "probe",
    "fleet.pool_probe": "probe",
    "traffic.sample": "probe",
    "conformance.run": "probe",
    "conformance.routing_probe": "probe",
    "bench.run": "bench",
    "bench.shard": "bench",
    "shadow.pair": "shadow",
    "shadow.replay": "shadow",
    "shadow.judge": "default",
    "shadow.purge": "default",
    "evals.run": "evals",
    "evals.reap": "default",
    "plans.refresh": "default",
    "prometheus.measure": "default",
    "bench.reap": "default",
    "conformance.reap": "default",
    "conformance.routing_reap": "default",
    "traffic.samples_prune": "default",
    "fleet.health_history_prune": "default",
    # A ramp's tick is short (read telemetry, maybe store a revision; a rollback's drain
    # pushes inline): beside the drain watchers, never behind a benchmark.
    "ramps.tick": "watch",
    "ramps.run": "watch",
    "ramps.watch_tick": "watch",
    "traffic.health_policy": "watch",
    "telemetry.downsample": "default",
    "webhooks.deliver": "default",
    "webhooks.prune": "default",
    "core.idempotency_prune": "default",
    # Batch: the controller's tick is short (expire, schedule a soak's next job, judge a
    # drill); the output comparison sends requests to the primary, beside the eval runs.
    "batch.tick": "watch",
    "batch.compare": "evals",
    # Schedules: claim each due row (a conditional UPDATE) and start its job; short.
    "schedules.due": "default",
}


def _beat_schedule() -> dict[str, dict[str, object]]:
    from django.conf import settings

    return {
        "probe-pool-health": {
            "task": "fleet.pools_probe_due",
            "schedule": float(settings.HEALTH_PROBE_INTERVAL_S),
            # A dispatch that could not start within one interval is stale: skip it.
            "options": {"expires": float(settings.HEALTH_PROBE_INTERVAL_S)},
        },
        "converge-pushes-and-drains": {
            "task": "traffic.converge",
            "schedule": float(settings.TRAFFIC_CONVERGE_INTERVAL_S),
            "options": {"expires": float(settings.TRAFFIC_CONVERGE_INTERVAL_S)},
        },
        "reconcile-gateways": {
            "task": "traffic.reconcile",
            "schedule": float(settings.TRAFFIC_RECONCILE_INTERVAL_S),
            "options": {"expires": float(settings.TRAFFIC_RECONCILE_INTERVAL_S)},
        },
        "sample-gateway-traffic": {
            "task": "traffic.sample",
            "schedule": 10.0,
            "options": {"expires": 10.0},
        },
        "prune-traffic-samples": {"task": "traffic.samples_prune", "schedule": 3600.0},
        "reap-benchmark-runs": {"task": "bench.reap", "schedule": 60.0,
                                "options": {"expires": 60.0}},
        "reap-conformance-runs": {"task": "conformance.reap", "schedule": 60.0,
                                  "options": {"expires": 60.0}},
        "reap-routing-probes": {"task": "conformance.routing_reap", "schedule": 60.0,
                                "options": {"expires": 60.0}},
        # Query and rules checks of open plans' gates: each is measured when due (its own
        # interval), so this only looks often enough for the shortest interval.
        "measure-metric-checks": {"task": "prometheus.measure", "schedule": 5.0,
                                  "options": {"expires": 5.0}},
        "refresh-plan-gates": {
            "task": "plans.refresh",
            "schedule": float(settings.PLAN_REFRESH_INTERVAL_S),
            "options": {"expires": float(settings.PLAN_REFRESH_INTERVAL_S)},
        },
        "prune-health-history": {
            "task": "fleet.health_history_prune",
            "schedule": 3600.0,
        },
        "judge-shadow-runs": {
            "task": "shadow.judge",
            "schedule": float(settings.SHADOW_JUDGE_INTERVAL_S),
            "options": {"expires": float(settings.SHADOW_JUDGE_INTERVAL_S)},
        },
        "purge-shadow-content": {"task": "shadow.purge", "schedule": 600.0,
                                 "options": {"expires": 600.0}},
        # Eval runs whose worker died are resumed by another (their rows say what is left).
        "reap-eval-runs": {"task": "evals.reap", "schedule": 30.0,
                           "options": {"expires": 30.0}},
        # Every active ramp whose next check is due, each claimed by a lease (ramps/).
        "tick-ramps": {"task": "ramps.tick", "schedule": float(settings.RAMP_TICK_INTERVAL_S),
                       "options": {"expires": float(settings.RAMP_TICK_INTERVAL_S)}},
        # Standing watches of completed ramps: each judges its newest whole window once.
        "tick-watches": {"task": "ramps.watch_tick",
                         "schedule": float(settings.RAMP_TICK_INTERVAL_S),
                         "options": {"expires": float(settings.RAMP_TICK_INTERVAL_S)}},
        "downsample-telemetry": {"task": "telemetry.downsample", "schedule": 60.0,
                                 "options": {"expires": 60.0}},
        "prune-webhook-deliveries": {"task": "webhooks.prune", "schedule": 3600.0},
        "prune-idempotency-keys": {"task": "core.idempotency_prune", "schedule": 3600.0},
        # Batch jobs past their window expire, soaks start their next job and end.
        "tick-batch": {"task": "batch.tick", "schedule": float(settings.BATCH_TICK_INTERVAL_S),
                       "options": {"expires": float(settings.BATCH_TICK_INTERVAL_S)}},
        # The schedules people edit (fleetctl/schedules/): one static entry that fires the
        # rows whose next occurrence has come, each claimed by a conditional UPDATE.
        "fire-schedules": {"task": "schedules.due",
                           "schedule": float(settings.SCHEDULES_TICK_S),
                           # A tick that waited is harmless (the rows say what is due).
                           "options": {"expires": max(3 * float(settings.SCHEDULES_TICK_S),
                                                      30.0)}},
    }


app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    task_queues=[Queue(name) for name in QUEUES],
    task_default_queue="default",
    task_routes={name: {"queue": queue} for name, queue in ROUTES.items()},
    # The prefork pool enforces these limits; the workers run threads (docs/queues.md), which
    # Celery cannot stop, so every task also bounds itself (timeouts on every call, deadlines).
    task_time_limit=600,
    task_soft_time_limit=540,
    task_acks_late=True,
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    timezone="UTC",
)
# Celery's Django fix-up closes each task thread's database connection before and after every
# task; reconnecting cost 15–25 ms of every gateway push under load (benchmarks/drain_latency.py).
# Keep a connection for up to this many tasks instead (Django still drops unusable ones).
app.conf.update(CELERY_DB_REUSE_MAX=int(os.environ.get("CELERY_DB_REUSE_MAX", "1000")))
app.conf.beat_schedule = _beat_schedule()
app.autodiscover_tasks()


def _warm_statistics(sender: object = None, **_: object) -> None:
    """An `evals` worker judges every run it finishes with scipy (confidence.py imports it
    where it is used, so web processes never pay for it). Import it in the background once the
    worker is ready, so the first run's verdict does not wait ~1–2 s for the import
    (benchmarks/eval_items_per_second.py: run 1's wall clock paid it)."""
    import threading

    consumer = getattr(sender, "app", app).amqp.queues.consume_from or {}
    if "evals" not in consumer:
        return

    def warm() -> None:
        import scipy.stats  # noqa: F401

    threading.Thread(target=warm, name="warm-scipy", daemon=True).start()


worker_ready.connect(_warm_statistics, weak=False)
