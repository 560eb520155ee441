"""The demo's capacity drill: a drain the primary cannot carry, spread by itself.

    python -m fleetctl.demo.capacity_drill --gateway http://127.0.0.1:8080

`make demo` starts it once (the supervised one-shot child "demo-drill"). It waits until the
seeded Gaudi ramp has ended (a drain during a ramp would pause it: a ramp never fights a
change it did not make) and the capacity run has measured the H200, then:

1. **fills the primary**: a burst of long streamed requests through the demo's Envoy on the
   route that gives the H200 its largest share (`llama-8b-batch`, 80 % on it), as many as
   its measured capacity (`pool_capacities`, in streams) less what it carries now, plus
   HEADROOM; and TPU_STREAMS on the route that gives the TPU its largest share
   (`llama-8b-eu`), so the TPU carries streams too. The burst goes where the H200 is the
   bigger part: on llama-8b itself after the ramp the Gaudi takes 50 % and the H200 45 %, so
   a burst there fills the Gaudi (as measured as the H200) first, and nothing could take a
   share;
2. waits until the gateway's live sample (beat's `traffic.sample`, `capacity.live_streams`)
   shows the H200 at or over its capacity and the TPU carrying streams;
3. drains the TPU off `llama-8b` only, as `system:demo-drill`
   (`drain_request(pool=tpu, routes=[llama-8b])`, pushed at once): the capacity check finds
   the primary full, so the record says **spread** (the rest to the Gaudi, which has room),
   with its numbers, on the drains page;
4. ends the burst, and RESTORE_AFTER_S later restores the drain.

Once per database: a drill drain (requested by `system:demo-drill`) that exists ends it at
start; one left unrestored (the demo stopped mid-drill) is restored first. So a second
`make demo` does not drill again. If the primary never fills within FILL_TIMEOUT_S, or a
condition never holds within WAIT_MAX_S, it says so in var/demo-drill.log and drains
nothing."""

from __future__ import annotations

import argparse
import math
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

ACTOR = "demo-drill"
ROUTE = "llama-8b"
POOL = "tpu-v5e-eu-west"
MODEL = "llama-3.1-8b-instruct"
REASON = ("demo capacity drill: a burst of long streams has filled the H200 primary past its "
          "measured capacity; the TPU v5e leaves llama-8b and its share must go elsewhere")
HEADROOM = 3  # streams beyond the primary's capacity, so the sample shows it full
TPU_STREAMS = 2
MAX_STREAMS = 64  # the burst never exceeds this, whatever the figure
POLL_S = 2.0
WAIT_MAX_S = 30 * 60.0
FILL_TIMEOUT_S = 90.0
RESTORE_AFTER_S = 60.0

Note = Callable[[str], None]


def _log(message: str) -> None:
    print(f"demo-drill: {message}", flush=True)


# --- what the drill reads and does (the database; tested with real parts) -------------------

def drill_drains() -> tuple[Any, Any]:
    """The drill's drain (or None) and its restore (or None)."""
    from fleetctl.traffic.models import Drain

    drain = (Drain.objects.filter(requested_by=f"system:{ACTOR}", action=Drain.Action.DRAIN)
             .order_by("pk").first())
    if drain is None:
        return None, None
    return drain, Drain.objects.filter(restores=drain).first()


def not_ready() -> str:
    """Why the drill cannot start yet ("" when it can)."""
    from fleetctl.fleet.models import Pool
    from fleetctl.ramps.models import ACTIVE_STATES, Ramp
    from fleetctl.traffic import selectors
    from fleetctl.traffic.capacity import pool_capacities
    from fleetctl.traffic.models import Route

    route = Route.objects.select_related("primary_pool").filter(name=ROUTE).first()
    if route is None:
        return f"no route {ROUTE}"
    if Ramp.objects.filter(route=route, state__in=ACTIVE_STATES).exists():
        return f"a ramp is active on {ROUTE} (a drain now would pause it)"
    current = selectors.revision_current(route=route)
    if current is None or current.weights.get(POOL, 0) <= 0:
        return f"{POOL} carries no weight on {ROUTE}"
    if not any(w > 0 for p, w in current.weights.items()
               if p not in (POOL, route.primary_pool.name)):
        return f"no pool but the primary carries {ROUTE} (the share would have nowhere to spread)"
    capacity = pool_capacities(MODEL, [route.primary_pool])[route.primary_pool.name]
    if capacity.streams is None:
        return f"the primary {route.primary_pool.name} has no capacity figure: {capacity.source}"
    if Pool.objects.filter(name__in=list(current.weights)).exclude(
            health_state=Pool.Health.HEALTHY).exists():
        return f"a pool of {ROUTE} is not healthy"
    return ""


def burst_plan() -> dict[str, Any]:
    """How many streams on which route: enough on the route that gives the primary its
    largest share to carry it past its capacity, and TPU_STREAMS where the TPU is largest."""
    from fleetctl.traffic import selectors
    from fleetctl.traffic.capacity import live_streams, pool_capacities
    from fleetctl.traffic.models import Route

    route = Route.objects.select_related("primary_pool").get(name=ROUTE)
    primary = route.primary_pool.name
    shares: dict[str, dict[str, int]] = {
        name: dict(rev.weights) for name, rev in (
            (r.name, selectors.revision_current(route=r))
            for r in Route.objects.filter(gateways__name="envoy-demo").distinct())
        if rev is not None}
    via = max(shares, key=lambda n: (shares[n].get(primary, 0), n != ROUTE, n))
    tpu_via = max(shares, key=lambda n: (shares[n].get(POOL, 0), n != ROUTE, n))
    streams = pool_capacities(MODEL, [route.primary_pool])[primary].streams or 0.0
    now = live_streams([primary]).get(primary, 0)
    wanted = max(0.0, streams + HEADROOM - now) / (shares[via][primary] / 10_000)
    routes = {r.name: r for r in Route.objects.filter(name__in=[via, tpu_via])}
    return {"primary": primary, "capacity": streams, "live": now, "via": via,
            "headers": _headers(routes[via]), "streams": min(MAX_STREAMS, math.ceil(wanted)),
            "tpu_via": tpu_via, "tpu_headers": _headers(routes[tpu_via])}


def _headers(route: Any) -> dict[str, str]:
    from django.conf import settings

    headers = {}
    if route.latency_class:
        headers[settings.TRAFFIC_LATENCY_CLASS_HEADER] = route.latency_class
    if route.residency:
        headers[settings.TRAFFIC_RESIDENCY_HEADER] = route.residency
    return headers


def primary_full(primary: str) -> tuple[bool, dict[str, int], float]:
    """Whether the gateways' newest sample shows the primary at or past its capacity with
    the TPU carrying streams; the live streams and the primary's capacity."""
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic.capacity import live_streams, pool_capacities

    live = live_streams([primary, POOL])
    cap = pool_capacities(MODEL, [Pool.objects.get(name=primary)])[primary].streams or 0.0
    return live.get(primary, 0) >= cap > 0 and live.get(POOL, 0) >= 1, live, cap


def drill_drain() -> Any:
    """Drain the TPU off llama-8b as the drill, pushed now: the record (its capacity check
    says what became of the share)."""
    from fleetctl.accounts.actor import Actor
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic import push, services
    from fleetctl.traffic.models import Route

    drain = services.drain_request(actor=Actor.for_system(ACTOR), reason=REASON,
                                   pool=Pool.objects.get(name=POOL),
                                   routes=[Route.objects.get(name=ROUTE)])
    return push.drain_push_now(drain)


def drill_restore(drain: Any) -> Any:
    from fleetctl.accounts.actor import Actor
    from fleetctl.traffic import push, services

    return push.drain_push_now(services.drain_restore(
        actor=Actor.for_system(ACTOR), drain=drain,
        reason=f"demo capacity drill over: {POOL} back on {ROUTE}"))


def summary(drain: Any) -> str:
    capacity = drain.capacity or {}
    return f"drain {drain.pk}: {capacity.get('decision', '?')} ({capacity.get('why', '')})"


# --- the burst (HTTP through the gateway) -------------------------------------------------------

class Burst:
    """Long streamed requests held open until `stop`: one thread each, reopened should an
    answer end first."""

    def __init__(self, gateway: str) -> None:
        self.url = gateway.rstrip("/") + "/v1/chat/completions"
        self.stop_event = threading.Event()
        self.threads: list[threading.Thread] = []
        self.errors: dict[str, int] = {}

    def add(self, count: int, headers: dict[str, str]) -> None:
        for i in range(count):
            thread = threading.Thread(target=self._hold, args=(i, headers), daemon=True)
            thread.start()
            self.threads.append(thread)

    def _hold(self, i: int, headers: dict[str, str]) -> None:
        import httpx

        body = {"model": MODEL, "stream": True, "max_tokens": 4096, "temperature": 0,
                "messages": [{"role": "user", "content": f"Tell a very long story, part {i}."}]}
        while not self.stop_event.is_set():
            try:
                with httpx.Client(timeout=httpx.Timeout(10.0, read=60.0)) as client, \
                        client.stream("POST", self.url, json=body, headers=headers) as answer:
                    if answer.status_code != 200:
                        self._error(f"HTTP {answer.status_code}")
                        self.stop_event.wait(1.0)
                        continue
                    for _ in answer.iter_raw():
                        if self.stop_event.is_set():
                            break
            except httpx.HTTPError as exc:
                self._error(type(exc).__name__)
                self.stop_event.wait(1.0)

    def _error(self, what: str) -> None:
        self.errors[what] = self.errors.get(what, 0) + 1

    def stop(self) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=10)


# --- the drill ------------------------------------------------------------------------------

def run(gateway: str, *, note: Note = _log, wait_max_s: float = WAIT_MAX_S,
        restore_after_s: float = RESTORE_AFTER_S) -> int:
    drain, restore = drill_drains()
    if drain is not None and restore is not None:
        note(f"already drilled ({summary(drain)}; restored by {restore.pk}): nothing to do")
        return 0
    if drain is None:
        deadline, said = time.monotonic() + wait_max_s, ""
        while (why := not_ready()) and time.monotonic() < deadline:
            if why != said:  # each reason once
                note(f"waiting: {why}")
                said = why
            time.sleep(POLL_S)
        if why:
            note(f"gave up after {wait_max_s:g} s: {why}; no drill")
            return 0
        drain = _drill(gateway, note)
        if drain is None:
            return 0
        time.sleep(restore_after_s)
    try:
        restore = drill_restore(drain)
    except Exception as exc:  # a route changed since: say so, a person restores by hand
        note(f"could not restore drain {drain.pk}: {exc}")
        return 0
    note(f"restored drain {drain.pk}: restore {restore.pk} ({restore.status})")
    return 0


def _drill(gateway: str, note: Note) -> Any:
    plan = burst_plan()
    note(f"the primary {plan['primary']} can carry {plan['capacity']:g} streams within its "
         f"SLO and carries {plan['live']}; sending {plan['streams']} long streams on "
         f"{plan['via']} and {TPU_STREAMS} on {plan['tpu_via']}")
    burst = Burst(gateway)
    burst.add(plan["streams"], plan["headers"])
    burst.add(TPU_STREAMS, plan["tpu_headers"])
    try:
        deadline = time.monotonic() + FILL_TIMEOUT_S
        full, live, cap = primary_full(plan["primary"])
        while not full and time.monotonic() < deadline:
            time.sleep(POLL_S)
            full, live, cap = primary_full(plan["primary"])
        if not full:
            note(f"the primary never filled within {FILL_TIMEOUT_S:g} s (live {live}, "
                 f"capacity {cap:g}; burst errors {burst.errors}): no drill")
            return None
        note(f"the gateway's sample shows it: live {live}, capacity {cap:g}")
        drain = drill_drain()
        note(summary(drain))
        return drain
    finally:
        burst.stop()
        note(f"burst ended (errors: {burst.errors or 'none'})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetctl.demo.capacity_drill",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", default="http://127.0.0.1:8080",
                        help="the demo Envoy's listener (default %(default)s)")
    args = parser.parse_args(argv)
    import django

    django.setup()
    return run(args.gateway)


if __name__ == "__main__":
    sys.exit(main())
