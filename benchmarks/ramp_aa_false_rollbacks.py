"""False rollbacks of A/A ramps: the candidate is the primary's twin (same simulator profile,
no replica noise), so every rollback, warn or failing check is a false alarm. Target 0.

Four routes (one model each) through two Envoy gateways, each route carrying streamed chat
traffic (the `openai` client, `--rps` per route); on each route, one guarded ramp of the twin
after another (20 % then 50 %, short holds), four routes in parallel, until `--ramps` ramps have
finished. Reported: how many completed, rolled back, paused on a warn, or ended otherwise; how
many FAIL checks and WARN decisions were written along the way; the wall time and the settings.

The real path, as benchmarks/ramp_fault_to_drained.py (whose World it uses): Envoy's access
log → the ingester process → windows → a Celery worker ticking the ramps (`ramps.tick` sent
every RAMP_TICK_INTERVAL_S, as beat does) and pushing each step to the gateways.

    .venv/bin/python benchmarks/ramp_aa_false_rollbacks.py [--ramps 20] [--routes 4]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

MODELS = ["llama-3.1-8b-instruct", "qwen2.5-7b-instruct", "mistral-7b-instruct",
          "gemma-2-9b-it"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ramps", type=int, default=20)
    parser.add_argument("--routes", type=int, default=4, choices=range(1, len(MODELS) + 1))
    parser.add_argument("--rps", type=float, default=5.0, help="per route")
    parser.add_argument("--hold-s", type=float, default=12.0)
    parser.add_argument("--window-s", type=int, default=10)
    parser.add_argument("--min-samples", type=int, default=8)
    args = parser.parse_args()
    from benchmarks.ramp_fault_to_drained import World, settings_line, setup_env

    setup_env("fleetctl_bench_ramp_aa")
    from fleetctl.ramps.models import Ramp, RampEvent
    from fleetctl.ramps.services import ramp_abort, ramp_create
    from fleetctl.traffic.services import revision_create
    from tests.ramps import e2e

    models = MODELS[:args.routes]
    routes = {f"aa-{i + 1}": (model, "primary") for i, model in enumerate(models)}
    work = Path(tempfile.mkdtemp(prefix="ramp-aa-"))
    began = time.monotonic()
    world = World(work, pools=["primary", "twin"], routes=routes, models=models)
    steps = [{"percent": 20, "hold_s": args.hold_s}, {"percent": 50, "hold_s": args.hold_s}]
    outcomes: Counter[str] = Counter()
    ramps: list[int] = []
    try:
        for model in models:
            world.traffic(args.rps, model=model)
        print(f"{args.routes} routes × {args.rps:g} streamed requests/s through 2 Envoys; "
              f"steps {steps}; window {args.window_s} s, min_samples {args.min_samples}, "
              f"failure_threshold 2; thresholds {e2e.THRESHOLDS}; {settings_line()}",
              flush=True)
        active: dict[str, int] = {}
        while len(ramps) < args.ramps or active:
            for name, route in world.routes.items():
                if name in active:
                    ramp = Ramp.objects.get(pk=active[name])
                    if ramp.state == "paused":  # a warn: a false alarm too; end it
                        outcomes["paused (warn)"] += 1
                        print(f"ramp {ramp.pk} on {name}: paused ({ramp.state_reason})",
                              flush=True)
                        ramp_abort(actor=world.actor, ramp=ramp, reason="benchmark: A/A warn")
                        del active[name]
                    elif not ramp.active:
                        outcomes[ramp.state] += 1
                        print(f"ramp {ramp.pk} on {name}: {ramp.state} "
                              f"({time.monotonic() - began:.0f} s)", flush=True)
                        del active[name]
                    continue
                if len(ramps) >= args.ramps:
                    continue
                route.refresh_from_db()
                revision_create(actor=world.actor, route=route, weights={"primary": 100},
                                base_revision=route.revision_number,
                                reason="benchmark: back to the primary before the next ramp")
                route.refresh_from_db()
                ramp = ramp_create(actor=world.actor, route=route, pool=world.pools["twin"],
                                   steps=steps, min_samples=args.min_samples,
                                   window_s=args.window_s, reason="benchmark A/A",
                                   **e2e.THRESHOLDS)
                active[name] = ramp.pk
                ramps.append(ramp.pk)
            time.sleep(1.0)
    finally:
        world.close()
    events = Counter(RampEvent.objects.filter(ramp_id__in=ramps)
                     .values_list("kind", flat=True))
    elapsed = time.monotonic() - began
    print(f"\n{len(ramps)} A/A ramps in {elapsed:.0f} s ({elapsed / 60:.1f} min): "
          + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items())))
    print(f"rollbacks: {outcomes['rolled-back']} (target 0); FAIL checks written: "
          f"{events['fail']}; WARN decisions: {events['warn']}; PASS: {events['pass']}; "
          f"WAIT notes: {events['wait']}")
    print(f"logs: {work}")


if __name__ == "__main__":
    main()
