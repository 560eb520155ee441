"""The demo's capacity evidence (called by `demo_seed` after the batch step): one short,
real benchmark run of the pools that carry llama-8b (the H200 primary, the Gaudi 3 the
seeded ramp steps up and the TPU v5e that takes short prompts), queued at seed time and run
by the demo's bench worker within its first minute or two. Its evidence is each pool's
SLO-qualified capacity, so the route page's Capacity card shows measured figures and
**Apply capacity split** works (docs/traffic.md, "Capacity splits"). Nothing here is a
number of its own: the worker measures the simulated pools.

Light on purpose too: it runs while the seeded ramp judges the Gaudi pool, and the guard
reads the pools' own /metrics, benchmark requests included. At 16 streams the Gaudi's TPOT
p95 under the benchmark went past twice the H200's on our loaded 2-core VM and rolled the
ramp back; 8 streams is a lighter load and a lower bound all the same.

A short run on purpose, and it says so in its name: three fixed levels (2, 4 and 8 streams),
a 5 s warm-up and a 10 s window, judged against the SLO the seeded ramp uses. A pool that
passes all three is credited with what it gave at 8 streams — a lower bound of what it
could carry, which is what a short demo run can honestly say. Run a full search
(Benchmarks → New run) for the real figure.

Created once: a run of this name, whatever became of it, is kept."""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import ObjectDoesNotExist, ValidationError

from fleetctl.accounts.actor import Actor
from fleetctl.core.errors import DomainError
from fleetctl.fleet.models import Pool

NAME = "demo capacity (short: levels 2, 4, 8)"
TRACE = "demo-chat"
POOLS = ("h200-us-east", "gaudi3-in-west", "tpu-v5e-eu-west")
MODEL = "llama-3.1-8b-instruct"
LEVELS = [2, 4, 8]
WARMUP_S, WINDOW_S, MIN_SAMPLES = 5.0, 10.0, 20
# The seeded ramp's SLO (demo_seed.RAMP): the bar the route's traffic is judged by.
SLO_TTFT_P95_MS, SLO_TPOT_P95_MS, SLO_ERROR_RATE = 250.0, 60.0, 0.02


def queue_short_run(*, name: str, pools: list[Pool], model_id: str,
                    slo: tuple[float, float, float], what: str,
                    note: Callable[[str], None]) -> list[str]:
    """Queue one of the demo's short benchmark runs (LEVELS, WARMUP_S, WINDOW_S, MIN_SAMPLES;
    `slo` = TTFT p95 ms, TPOT p95 ms, error rate) on the demo trace unless a run of `name`
    exists: what was made (a refusal is passed to `note`, naming `what`). The one way the
    seed queues a benchmark, so a test shortens them all in one place."""
    from django.db import transaction

    from fleetctl.bench import services as bench
    from fleetctl.bench.models import Run, Trace

    if Run.objects.filter(name=name).exists():
        return []
    ttft, tpot, error_rate = slo
    try:
        with transaction.atomic():
            bench.run_create(
                actor=Actor.for_system("demo-seed"), name=name,
                trace=Trace.objects.get(name=TRACE), pools=pools, model_id=model_id,
                mode=Run.Mode.LEVELS, levels=LEVELS, max_concurrency=max(LEVELS),
                warmup_s=WARMUP_S, window_s=WINDOW_S, min_samples=MIN_SAMPLES,
                slo_ttft_p95_ms=ttft, slo_tpot_p95_ms=tpot, slo_error_rate=error_rate)
    except (ValidationError, DomainError, ObjectDoesNotExist) as exc:
        note(f"{what} not queued: {exc}")
        return []
    return [f"benchmark run {name!r}"]


def seed_capacity_run(note: Callable[[str], None] = print) -> list[str]:
    """Queue the demo's capacity benchmark unless one of its name exists: what was made (a
    refusal is passed to `note`)."""
    try:
        pools = [Pool.objects.get(name=name) for name in POOLS]
    except Pool.DoesNotExist as exc:
        note(f"capacity benchmark not queued: {exc}")
        return []
    return queue_short_run(name=NAME, pools=pools, model_id=MODEL,
                           slo=(SLO_TTFT_P95_MS, SLO_TPOT_P95_MS, SLO_ERROR_RATE),
                           what="capacity benchmark", note=note)
