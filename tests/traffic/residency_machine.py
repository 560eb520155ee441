"""The state machine of a stateful property test: random sequences of registry and
traffic operations (split changes, pool and route drains, restores, pool registration,
deletion, renames, region moves, jurisdiction changes, endpoint changes, mirroring for shadow
runs set and cleared; guarded ramps started over REST on any route with any pool, ticked by
the controller (a hold passed on telemetry written for it, or skipped), paused, resumed and
aborted; pools' health flipped by the probe's results under each route's health policy,
whose drains and restores are applied and pushed; a migration plan whose candidate is one of
the pools, opened, moved through its gates, regressed, paused, resumed and abandoned), and
after every step the questions that matter: where does the real Envoy send requests pinned
to a jurisdiction, and does it give the plan's candidate weight its stage does not allow?
Every pool it gives a pinned route weight must be registered in that jurisdiction, and so
must every pool registered at each endpoint it would connect to (a ramp's step is re-checked
at its tick; a registry edit under a ramp is refused or leaves the gateway at 0 for the
pool); a ramp of a pool outside a route's pin is refused when started; and no pinned route
is mirrored (desired state or Envoy) while one of its mirror pools is gone, renamed or
outside the pin (the shadow worker would send the copies there). The stage rules (issue
16), in the stored state at once and in Envoy once settled: below stage 3, or paused, the
candidate holds no weight on any route; at stage 3 only on its plan's batch-class routes;
none on a route of a plan abandoned there; and a plan is refused exactly when its candidate
carries weight. Real PostgreSQL, a real Celery worker pushing (and running the ramps'
queued ticks and the health policy's task), a real Envoy read back through its admin API
(`/clusters` for the endpoints it would really use).

Endpoints are written in every spelling an attacker would try (issue 25): `localhost`,
`LOCALHOST`, other loopback addresses, `[::1]`, this host's own addresses, `0.0.0.0`,
`127.1`, `2130706433`, `0x7f.1`, `[::ffff:127.0.0.1]`, a name that does not resolve, with
and without a path. Whether two endpoints are one server is judged here on its own terms
(`server_of`: the machine's resolver, every loopback and local address one host), not by
the product's code.

tests/traffic/test_residency_property.py runs ten sequences in the suite;
benchmarks/residency_fuzz.py runs the same machine for 1,000+ sequences through the real web
server and counts crossings. `api` is anything with DRF's test client's post/patch/delete."""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import socket
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import httpx
from django.conf import settings
from django.contrib.auth.models import Group, User
from django.core.exceptions import ValidationError
from django.utils import timezone
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from fleetctl.accounts.actor import Actor
from fleetctl.core.errors import DomainError
from fleetctl.fleet.models import HealthTransition, Pool
from fleetctl.fleet.services import pool_health_record, pool_model_create, region_create
from fleetctl.ramps.models import Ramp
from fleetctl.ramps.services import ramps_tick, step_data_start
from fleetctl.traffic import selectors
from fleetctl.traffic.gateways.base import adapter_for
from fleetctl.traffic.health import policy_apply
from fleetctl.traffic.models import Gateway, GatewayPush, Route
from fleetctl.traffic.push import drain_push_now
from fleetctl.traffic.services import (
    gateway_set_routes,
    route_create,
    route_mirror_clear,
    route_mirror_set,
)
from migrations_plan import services as plans
from migrations_plan.models import GateCheck, Plan
from tests.conftest import SYSTEM
from tests.ramps.windows import traffic
from tests.support.waiting import wait_until

JURISDICTIONS = ("EU", "US", "IN")
REGIONS = ("eu1", "eu2", "us", "in")
NAMES = ("a", "b", "c", "d", "e", "f")
PORTS = 6  # endpoints per sequence: few, so that pools compete for them
# How a pool's endpoint is written: index 0 is the plain form; the rest are other spellings of
# a server on this host (and one name that resolves nowhere), each drawn as often.
_OWN = sorted({str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)
               if not ipaddress.ip_address(info[4][0]).is_loopback})
SPELLINGS = ("127.0.0.1", "localhost", "LOCALHOST", "127.0.0.2", "[::1]", "0.0.0.0",
             "127.1", "2130706433", "0x7f.1", "[::ffff:127.0.0.1]", "gpu.unresolvable.invalid",
             *(f"[{a}]" if ":" in a else a for a in _OWN))
PATHS = ("", "/", "/v1")


@functools.lru_cache(maxsize=8192)
def server_of(host: str, port: int) -> frozenset[tuple[str, int]]:
    """The servers `host:port` reaches, by this test's own reading: every address the
    machine's resolver gives (IPv4-mapped ones as IPv4); loopback, unspecified and this
    host's own addresses are one host; a name that does not resolve stands for itself.
    Kept for the run: the machine's names do not change meanwhile, and the invariant asks
    after every step for every pool registered so far."""
    host = host.strip("[]").rstrip(".").lower()
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError):
        return frozenset({(f"name:{host}", port)})
    found = set()
    for info in infos:
        address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
            address = address.ipv4_mapped
        local = address.is_loopback or address.is_unspecified or str(address) in _OWN
        found.add(("this host" if local else str(address), port))
    return frozenset(found)


def url_servers(url: str) -> frozenset[tuple[str, int]]:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme.lower() == "https" else 80)
    return server_of(parts.hostname or "", port)
# A guarded ramp's steps (percents drawn from these) and its guard: the pools are in no plan,
# so the thresholds are given; few samples and short holds, so that a tick can pass a hold on
# a few telemetry windows written for it.
RAMP_PERCENTS = (5, 25, 50, 100)
RAMP_GUARD = {"slo_ttft_p95_ms": 500.0, "slo_tpot_p95_ms": 100.0, "slo_error_rate": 0.05,
              "latency_margin_pct": 10.0, "min_samples": 5, "window_s": 10,
              "failure_threshold": 2}
GOOD = [100.0] * 20  # a window of a healthy pool: 20 streamed answers, 100 ms to the first byte
HEALTH_POLICIES = ("off", "drain", "drain-restore")
# The migration plan of each sequence: candidate f (a US pool in no other role, so the pinned
# routes' exploration is unchanged) onto the batch-class route, with c (its primary) as the
# plan's primary; the unpinned route `any` is an interactive route of no plan (the guard is
# per pool). Who moves it: an author, another platform lead (who attests, approves and
# advances) and an on-call (stage 3's incident check).
PLAN_ROUTES = ("batch",)
ATTESTERS = {"platform-lead": "lead", "on-call": "oncall"}


class Crossing(AssertionError):
    pass


def envoy_view(gateway: Gateway
               ) -> tuple[dict[str, dict[str, int]], dict[str, set[tuple[str, int]]]]:
    """What the real Envoy holds: route -> {cluster: weight > 0}, and cluster -> the
    endpoints it would connect to."""
    held = adapter_for(selectors.gateway_spec(gateway)).read_back()
    clusters = httpx.get(f"{gateway.admin_address}/clusters", params={"format": "json"},
                         timeout=10).json()
    endpoints: dict[str, set[tuple[str, int]]] = {}
    for cluster in clusters.get("cluster_statuses", []):
        for host in cluster.get("host_statuses", []):
            where = host["address"]["socket_address"]
            endpoints.setdefault(cluster["name"], set()).update(
                server_of(where["address"], int(where["port_value"])))
    return held, endpoints


def crossings(gateway: Gateway, *, settled: bool,
              view: tuple[dict[str, dict[str, int]], dict[str, set[tuple[str, int]]]]
              | None = None
              ) -> list[str]:
    """Pinned traffic that Envoy would send outside its pin, judged by the registry now.
    `settled`: the gateway has applied the latest state, so each weighted cluster must also
    map to a registered pool (before that, an endpoint may have been renumbered since)."""
    held, endpoints = view or envoy_view(gateway)
    pools = list(Pool.objects.select_related("region"))
    where = {p.name: p.region.jurisdiction for p in pools}
    at_endpoint: dict[tuple[str, int], set[str]] = {}
    for pool in pools:
        for url in pool.base_urls:
            for server in url_servers(url):
                at_endpoint.setdefault(server, set()).add(pool.region.jurisdiction)
    found = []
    for route in Route.objects.filter(gateways=gateway).exclude(residency=""):
        for cluster in held.get(route.name, {}):
            if cluster in where and where[cluster] != route.residency:
                found.append(f"{route.name} ({route.residency}) -> pool {cluster} in "
                             f"{where[cluster]}")
            if settled and cluster not in where:
                found.append(f"{route.name} -> cluster {cluster} that is no registered pool")
            for endpoint in endpoints.get(cluster, set()):
                seen = at_endpoint.get(endpoint, set())
                if seen - {route.residency} or (settled and not seen):
                    found.append(f"{route.name} ({route.residency}) -> {endpoint}, registered "
                                 f"in {sorted(seen) or 'no pool'}")
    return found


def mirror_crossings(gateway: Gateway, *, settled: bool) -> list[str]:
    """Pinned routes mirrored — in the desired state, or (`settled`) in what the real Envoy
    holds — while a mirror pool is gone, renamed or outside the pin, judged by the registry
    now."""
    shares = {r.key: r.mirror_bp for r in selectors.gateway_desired_state(gateway=gateway).routes}
    if settled:
        adapter = adapter_for(selectors.gateway_spec(gateway))
        adapter.read_back()
        held = adapter.read_back_mirror() or {}
    pools = {p.pk: p for p in Pool.objects.select_related("region")}
    found = []
    for route in Route.objects.filter(gateways=gateway).exclude(residency=""):
        seen = [("desired state", shares.get(route.name, 0))]
        if settled:
            seen.append(("Envoy", held.get(route.name, 0)))
        for where, share in seen:
            if not share:
                continue
            for name, pk in (route.mirror_pools or {}).items():
                pool = pools.get(pk)
                if pool is None or pool.name != name or \
                        pool.region.jurisdiction != route.residency:
                    found.append(f"{where} mirrors {route.name} ({route.residency}, "
                                 f"{share} bp) with mirror pool {name} "
                                 f"{'in ' + pool.region.jurisdiction if pool else 'gone'}")
    return found


def stage_breaches(held: dict[str, dict[str, int]], where: str) -> list[str]:
    """Weight a plan's candidate holds against its plan's stage (issue 16's stage rules, read
    from the plans, not from the guard): no weight below stage 3 or while paused; at stage 3
    only on the plan's batch-class routes (no interactive weight, no other route); none on the
    routes of a plan abandoned there; stage 4 or completed lifts it. `held`: route -> {pool
    name: basis points}, as a gateway holds it (or should)."""
    weighted = {name for weights in held.values() for name, bp in weights.items() if bp}
    by_pool: dict[int, list[Plan]] = {}
    for plan in (Plan.objects.filter(candidate_pool__name__in=weighted)
                 .select_related("candidate_pool").prefetch_related("routes")
                 .order_by("-created_at", "-id")):
        by_pool.setdefault(plan.candidate_pool_id, []).append(plan)
    routes = {r.name: r for r in Route.objects.filter(name__in=held)}
    found = []
    for pool_plans in by_pool.values():
        name = pool_plans[0].candidate_pool.name
        for route_name, weights in held.items():
            route = routes.get(route_name)
            if not weights.get(name) or route is None:
                continue
            why = ""
            for plan in pool_plans:
                on_route = route.pk in {r.pk for r in plan.routes.all()}
                if plan.state == Plan.State.PAUSED or (plan.is_open and plan.stage < 3):
                    why = f"plan {plan.name} is {plan.state} at stage {plan.stage}"
                elif plan.state == Plan.State.STAGE_3 and route.latency_class != "batch":
                    why = f"plan {plan.name} is at stage 3 and {route_name} is interactive"
                elif plan.state == Plan.State.STAGE_3 and not on_route:
                    why = f"plan {plan.name} is at stage 3 and {route_name} is not its route"
                if why:
                    break
            newest_here = next((p for p in pool_plans
                                if route.pk in {r.pk for r in p.routes.all()}), None)
            if not why and newest_here and newest_here.state == Plan.State.ABANDONED:
                why = f"plan {newest_here.name} was abandoned on it"
            if why:
                found.append(f"{where}: {route_name} gives {weights[name]} bp to candidate "
                             f"{name}: {why}")
    return found


def settle(gateway: Gateway) -> None:
    """Until every push is done and Envoy holds the desired state."""
    adapter = adapter_for(selectors.gateway_spec(gateway))

    def done() -> bool:
        if GatewayPush.objects.filter(gateway=gateway,
                                      status__in=["pending", "retrying"]).exists():
            return False
        desired = selectors.gateway_desired_state(gateway=gateway)
        return adapter.matches(desired, adapter.read_back()) and \
            adapter.mirror_matches(desired)[0]

    try:
        wait_until(done, timeout_s=60, every_s=0.02, what="the gateway to hold the state")
    except AssertionError as exc:
        pushes = list(GatewayPush.objects.filter(gateway=gateway).order_by("-pk")[:5].values(
            "pk", "status", "reason", "attempts", "last_error", "revision__route__name"))
        desired = selectors.gateway_desired_state(gateway=gateway).held_weights()
        raise AssertionError(f"{exc}; newest pushes {pushes}; desired {desired}; held "
                             f"{adapter.read_back()}") from exc


def make_machine(api: Any, gateway: Gateway, numbers: Iterator[int],
                 on_crossing: Callable[[list[str]], object] | None = None) -> type:
    """`on_crossing`: called with what was found instead of failing (the benchmark counts)."""

    class RegistryAndTraffic(RuleBasedStateMachine):
        """One sequence: its own regions, pools, model and routes (names carry the sequence
        number, so sequences never see each other's rows); the gateway carries its routes."""

        @initialize(stage=st.sampled_from([1, 2, 3, 3, 4]))
        def fleet(self, stage: int) -> None:
            """`stage`: where the sequence's plan starts (stage 3 most often: its rules are
            the new ones), moved there through its gates (attested, approved, advanced) as
            people move it; from stage 3 the candidate then takes what its stage allows (the
            batch route; at stage 4 the unpinned interactive route too), so that leaving the
            stage has something to drain."""
            self.n = next(numbers)
            self.model = f"model-{self.n}"
            self.regions = {}
            for code, jurisdiction in zip(REGIONS, ("EU", "EU", "US", "IN"), strict=True):
                self.regions[code] = region_create(actor=SYSTEM, code=f"s{self.n}-{code}",
                                                   name=code, jurisdiction=jurisdiction).code
            self.port0 = 20000 + self.n * PORTS
            # e: a second IN pool, so that the IN route has a pool to ramp onto.
            # f: the candidate of the sequence's migration plan.
            for name, region, port in (("a", "eu1", 0), ("b", "eu2", 1), ("c", "us", 2),
                                       ("d", "in", 3), ("e", "in", 4), ("f", "us", 5)):
                self._register(name, region, port)
            pool = {p.name: p for p in Pool.objects.filter(name__startswith=f"s{self.n}-")}
            routes = [
                route_create(actor=SYSTEM, name=f"s{self.n}-eu", model_id=self.model,
                             residency="EU", primary_pool=pool[self.pool("a")],
                             weights={self.pool("a"): 50, self.pool("b"): 50}),
                route_create(actor=SYSTEM, name=f"s{self.n}-any", model_id=self.model,
                             primary_pool=pool[self.pool("c")],
                             weights={self.pool("c"): 70, self.pool("a"): 30}),
                route_create(actor=SYSTEM, name=f"s{self.n}-in", model_id=self.model,
                             residency="IN", primary_pool=pool[self.pool("d")]),
                route_create(actor=SYSTEM, name=f"s{self.n}-batch", model_id=self.model,
                             latency_class="batch", primary_pool=pool[self.pool("c")]),
            ]
            gateway_set_routes(actor=SYSTEM, gateway=gateway, routes=routes)
            self.routes = [r.name for r in routes]
            self.drains: list[int] = []
            self.ramps: list[int] = []
            settle(gateway)
            self.people = {}
            for who, role in (("author", "platform-lead"), ("lead", "platform-lead"),
                              ("oncall", "on-call")):
                user = User.objects.create_user(f"s{self.n}-{who}")
                user.groups.set([Group.objects.get_or_create(name=role)[0]])
                self.people[who] = Actor(user=user)
            self.plans = 0
            self._plan_open()
            for _ in range(stage - 1):
                self._plan_advance()
            plan = self._plan()
            if plan is not None and plan.stage >= 3:
                self.candidate_share(3, 20)
            if plan is not None and plan.stage == 4:
                self.candidate_share(1, 20)
            settle(gateway)

        # --- helpers ---------------------------------------------------------------------------
        def pool(self, name: str) -> str:
            return f"s{self.n}-{name}"

        def url(self, port: int, spelling: int = 0, path: str = "") -> str:
            return f"http://{SPELLINGS[spelling]}:{self.port0 + port}{path}"

        def _register(self, name: str, region: str, port: int, spelling: int = 0,
                      path: str = "") -> int:
            answer = api.post("/api/v1/pools/", {
                "name": self.pool(name), "runtime": "cuda", "accelerator": "H100",
                "region": self.regions[region],
                "base_urls": [self.url(port, spelling, path)],
                "max_context_tokens": 4096, "node_hourly_rate": "1"}, format="json")
            if answer.status_code == 201:
                pool = Pool.objects.get(name=self.pool(name))
                pool_model_create(actor=SYSTEM, pool=pool, model_id=self.model,
                                  max_context_tokens=4096)
                pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
            return answer.status_code

        def _answered(self, answer: httpx.Response | Any) -> None:
            assert answer.status_code < 500, answer.content

        def _found(self, found: list[str]) -> None:
            if found and on_crossing is not None:
                on_crossing(found)
            elif found:
                raise Crossing("; ".join(found))

        def _pick_pool(self, pick: int, name: str) -> str:
            """A pool name: `name` (which may be registered nowhere, or out of a pin) when
            `pick` is below 4, else one of the sequence's registered pools, so that most draws
            reach past "no such pool" to the rules that matter."""
            pools = list(Pool.objects.filter(name__startswith=f"s{self.n}-").order_by("pk")
                         .values_list("name", flat=True))
            return pools[pick % len(pools)] if pick >= 4 and pools else self.pool(name)

        def _plan(self) -> Plan | None:
            return Plan.objects.filter(name=f"s{self.n}-plan-{self.plans}").first()

        def _plan_open(self) -> None:
            """A new plan for f. Refused (409) exactly when f carries weight on a route."""
            pool = Pool.objects.filter(name=self.pool("f")).first()
            primary = Pool.objects.filter(name=self.pool("c")).first()
            if pool is None or primary is None:
                return
            routes = [Route.objects.get(name=f"s{self.n}-{r}") for r in PLAN_ROUTES]
            carrying = [route for route, rev in selectors.revisions_current(
                routes=list(Route.objects.filter(name__startswith=f"s{self.n}-"))).items()
                if rev.weights.get(pool.name)]
            try:
                plans.plan_create(actor=self.people["author"], name=f"s{self.n}-plan-"
                                  f"{self.plans + 1}", candidate_pool=pool, primary_pool=primary,
                                  routes=routes, slo_ttft_p95_ms=800, slo_tpot_p95_ms=60,
                                  slo_error_rate=0.01)
            except (DomainError, ValidationError) as exc:
                if carrying and "already carries" in str(exc):
                    return
                if not carrying and "already carries" in str(exc):
                    self._found([f"plan refused for {pool.name}, which carries no weight: "
                                 f"{exc}"])
                return  # refused for another reason (a pool unfit for a route, say)
            self.plans += 1
            if carrying:
                self._found([f"plan opened for {pool.name} while it carries weight on "
                             f"{len(carrying)} route(s)"])

        def _plan_advance(self) -> None:
            """Attest what needs a person, approve with a justification, advance; a gate
            that fails (the pool unhealthy, say) refuses it, as it would a person."""
            plan = self._plan()
            if plan is None or not plan.in_stage:
                return
            try:
                for check in plan.checks.filter(stage=plan.stage, removed_at__isnull=True,
                                                kind=GateCheck.Kind.ATTESTED):
                    if not check.attestations.filter(withdrawn_at__isnull=True).exists():
                        plans.attest(actor=self.people[ATTESTERS[check.attest_role]],
                                     check=check, note=f"fuzz: stage {plan.stage}")
                plans.approve(actor=self.people["lead"], plan=plan,
                              justification="fuzz: signed off on the evidence shown")
                plans.advance(actor=self.people["lead"], plan=plan, reason="fuzz")
            except (DomainError, ValidationError):
                return

        def _tick(self, pk: int, now: Any = None) -> None:
            """One tick of one ramp here, as the controller's: the worker's own run (queued
            on create, resume and skip) may come before or after it; the lease serializes
            them and a late one finds nothing to do but note the hold."""
            ramps_tick(now=now or timezone.now(), only=pk)

        # --- traffic -----------------------------------------------------------------------------
        @rule(route=st.integers(0, 3), names=st.lists(st.sampled_from(NAMES), min_size=1,
                                                       max_size=3, unique=True),
              force=st.booleans(), data=st.data())
        def ramp(self, route: int, names: list[str], force: bool, data: Any) -> None:
            shares = data.draw(st.lists(st.integers(1, 100), min_size=len(names),
                                        max_size=len(names)))
            total = sum(shares)
            # In basis points (a split is refused finer than 0.01 %), the rounding to the first.
            points = [s * 10_000 // total for s in shares]
            points[0] += 10_000 - sum(points)
            weights = {self.pool(n): p / 100 for n, p in zip(names, points, strict=True)}
            name = self.routes[route]
            current = Route.objects.get(name=name).revision_number
            self._answered(api.post(f"/api/v1/routes/{name}/revisions/", {
                "weights": weights, "base_revision": current, "reason": "fuzz",
                "force": force}, format="json"))

        @rule(name=st.sampled_from(NAMES))
        def drain_pool(self, name: str) -> None:
            answer = api.post("/api/v1/drains/", {"pool": self.pool(name), "reason": "fuzz"},
                              format="json")
            self._answered(answer)
            if answer.status_code == 202:
                self.drains.append(answer.json()["id"])

        @rule(route=st.integers(0, 3))
        def drain_route(self, route: int) -> None:
            answer = api.post("/api/v1/drains/", {"route": self.routes[route], "reason": "fuzz"},
                              format="json")
            self._answered(answer)
            if answer.status_code == 202:
                self.drains.append(answer.json()["id"])

        @rule(pick=st.integers(0, 15))
        def restore(self, pick: int) -> None:
            # Drawn whether or not there is a drain: what is drawn may not depend on the
            # server's answers (hypothesis replays draws).
            if self.drains:
                drain = self.drains[pick % len(self.drains)]
                self._answered(api.post(f"/api/v1/drains/{drain}/restore/", {"reason": "fuzz"},
                                        format="json"))

        # --- the registry ------------------------------------------------------------------------
        @rule(name=st.sampled_from(NAMES), region=st.sampled_from(REGIONS),
              port=st.integers(0, PORTS - 1), spelling=st.integers(0, len(SPELLINGS) - 1),
              path=st.sampled_from(PATHS))
        def register_pool(self, name: str, region: str, port: int, spelling: int,
                          path: str) -> None:
            assert self._register(name, region, port, spelling, path) < 500

        @rule(name=st.sampled_from(NAMES))
        def delete_pool(self, name: str) -> None:
            self._answered(api.delete(f"/api/v1/pools/{self.pool(name)}/"))

        @rule(name=st.sampled_from(NAMES), new=st.sampled_from(NAMES))
        def rename_pool(self, name: str, new: str) -> None:
            self._answered(api.patch(f"/api/v1/pools/{self.pool(name)}/",
                                     {"name": self.pool(new)}, format="json"))

        @rule(name=st.sampled_from(NAMES), region=st.sampled_from(REGIONS))
        def move_pool(self, name: str, region: str) -> None:
            self._answered(api.patch(f"/api/v1/pools/{self.pool(name)}/",
                                     {"region": self.regions[region]}, format="json"))

        @rule(name=st.sampled_from(NAMES), port=st.integers(0, PORTS - 1),
              spelling=st.integers(0, len(SPELLINGS) - 1), path=st.sampled_from(PATHS))
        def change_endpoint(self, name: str, port: int, spelling: int, path: str) -> None:
            self._answered(api.patch(f"/api/v1/pools/{self.pool(name)}/",
                                     {"base_urls": [self.url(port, spelling, path)]},
                                     format="json"))

        @rule(region=st.sampled_from(REGIONS), jurisdiction=st.sampled_from(JURISDICTIONS))
        def change_jurisdiction(self, region: str, jurisdiction: str) -> None:
            self._answered(api.patch(f"/api/v1/regions/{self.regions[region]}/",
                                     {"jurisdiction": jurisdiction}, format="json"))

        # --- mirroring (shadow runs) --------------------------------------------------------------
        @rule(route=st.integers(0, 3), names=st.lists(st.sampled_from(NAMES), min_size=1,
                                                       max_size=2, unique=True),
              percent=st.sampled_from([0.5, 12.5, 100.0]))
        def mirror(self, route: int, names: list[str], percent: float) -> None:
            pools = list(Pool.objects.filter(name__in=[self.pool(n) for n in names]))
            if not pools:
                return
            # Refused (400) when a pool is outside the pin or does not serve the model.
            with contextlib.suppress(ValidationError):
                route_mirror_set(actor=SYSTEM, route=Route.objects.get(name=self.routes[route]),
                                 percent=percent, pools=pools, owner=f"fuzz run {self.n}")

        @rule(route=st.integers(0, 3))
        def mirror_stop(self, route: int) -> None:
            route_mirror_clear(actor=SYSTEM, route=Route.objects.get(name=self.routes[route]),
                               reason="fuzz")

        # --- guarded ramps (fleetctl/ramps) -------------------------------------------------------
        @rule(route=st.integers(0, 3), name=st.sampled_from(NAMES), pick=st.integers(0, 15),
              percents=st.lists(st.sampled_from(RAMP_PERCENTS), min_size=1, max_size=3,
                                unique=True),
              hold=st.sampled_from([10, 20]), aim=st.booleans())
        def guarded_ramp_start(self, route: int, name: str, pick: int, percents: list[int],
                               hold: int, aim: bool) -> None:
            """`aim`: a pool the registry has in the route's pin now (not its primary), if
            there is one; else any name, most often a registered pool's (refused out of the
            pin: 400)."""
            route_name = self.routes[route]
            pool_name = self._pick_pool(pick, name)
            if aim:
                target = Route.objects.get(name=route_name)
                fits = Pool.objects.filter(name__startswith=f"s{self.n}-").exclude(
                    pk=target.primary_pool_id).order_by("pk")
                if target.residency:
                    fits = fits.filter(region__jurisdiction=target.residency)
                names = list(fits.values_list("name", flat=True))
                pool_name = names[pick % len(names)] if names else pool_name
            pool = Pool.objects.select_related("region").filter(name=pool_name).first()
            answer = api.post("/api/v1/ramps/", {
                "route": route_name, "pool": pool_name, "reason": "fuzz",
                "steps": [{"percent": p, "hold_s": hold} for p in sorted(percents)],
                **RAMP_GUARD}, format="json")
            self._answered(answer)
            if answer.status_code != 201:
                return  # refused: out of the pin, the primary, unhealthy, gone, or one active
            residency = Route.objects.get(name=route_name).residency
            if residency and (pool is None or pool.region.jurisdiction != residency):
                self._found([f"ramp of {pool_name} "
                             f"({pool.region.jurisdiction if pool else 'gone'}) on "
                             f"{route_name} ({residency}) accepted (201), not refused"])
            pk = answer.json()["id"]
            self.ramps.append(pk)
            self._tick(pk)  # its first step (which the worker's queued run may set first)

        @precondition(lambda self: bool(self.ramps))
        @rule(skip=st.booleans())
        def guarded_ramps_tick(self, skip: bool) -> None:
            """The controller drives each of the sequence's running ramps a step: past its
            hold on passing telemetry written for its pool and the route's primary, or (`skip`)
            by skipping the hold over REST."""
            for pk in self.ramps:
                ramp = Ramp.objects.select_related("pool", "route__primary_pool").get(pk=pk)
                if ramp.state != Ramp.State.RUNNING:
                    continue
                if ramp.step_started_at is None:  # resumed, or its first step not set yet
                    self._tick(pk)
                elif skip:
                    self._answered(api.post(f"/api/v1/ramps/{pk}/skip/", {"reason": "fuzz"},
                                            format="json"))
                    self._tick(pk)
                else:
                    hold = float(ramp.steps[ramp.step_index]["hold_s"])
                    now = max(timezone.now(),
                              ramp.step_started_at + timedelta(seconds=hold + 11))
                    since = max(step_data_start(ramp.step_started_at),
                                now - timedelta(seconds=30))
                    traffic(since=since, until=now, route=ramp.route.name,
                            per_window={ramp.pool.name: GOOD,
                                        ramp.route.primary_pool.name: GOOD})
                    self._tick(pk, now)

        @precondition(lambda self: bool(self.ramps))
        @rule(pick=st.integers(0, 15),
              action=st.sampled_from(["pause", "resume", "resume", "abort"]))
        def guarded_ramp_act(self, pick: int, action: str) -> None:
            if not self.ramps:
                return
            pk = self.ramps[pick % len(self.ramps)]
            answer = api.post(f"/api/v1/ramps/{pk}/{action}/", {"reason": "fuzz"},
                              format="json")
            self._answered(answer)
            if action == "resume" and answer.status_code == 200:
                self._tick(pk)  # the step's split set again

        # --- the migration plan (issue 16's stage rules) -----------------------------------------
        @rule()
        def plan_advance(self) -> None:
            self._plan_advance()

        @rule(action=st.sampled_from(["regress", "regress", "pause", "resume", "abandon"]),
              back=st.integers(1, 3))
        def plan_leave(self, action: str, back: int) -> None:
            """Back `back` stages (to stage 1 at least), a pause, a resume or abandoning:
            from stage 3 or 4 the candidate's weight is drained (and pushed) in the same
            move."""
            plan = self._plan()
            if plan is None:
                return
            lead = self.people["lead"]
            try:
                if action == "regress":
                    plans.regress(actor=lead, plan=plan, to_stage=max(1, plan.stage - back),
                                  reason="fuzz")
                elif action == "pause":
                    plans.pause(actor=self.people["oncall"], plan=plan, reason="fuzz")
                elif action == "resume":
                    plans.resume(actor=lead, plan=plan, reason="fuzz")
                else:
                    plans.abandon(actor=lead, plan=plan, reason="fuzz")
            except (DomainError, ValidationError):
                return  # not open, not paused, not an earlier stage

        @rule(route=st.sampled_from([1, 3]), percent=st.sampled_from([5, 50]))
        def candidate_share(self, route: int, percent: int) -> None:
            """A share for the candidate f on the unpinned route or the batch route (the rest
            to the route's primary), over REST: stored or refused as its plan's stage says;
            the invariant judges what was stored."""
            name = self.routes[route]
            target = Route.objects.select_related("primary_pool").get(name=name)
            if target.primary_pool.name == self.pool("f"):
                return
            self._answered(api.post(f"/api/v1/routes/{name}/revisions/", {
                "weights": {target.primary_pool.name: 100 - percent, self.pool("f"): percent},
                "base_revision": target.revision_number, "reason": "fuzz"}, format="json"))

        @rule()
        def plan_open(self) -> None:
            plan = self._plan()
            if plan is None or not plan.is_open:
                self._plan_open()

        # --- the health policy (fleetctl/traffic/health.py) ---------------------------------------
        @rule(route=st.integers(0, 3), policy=st.sampled_from(HEALTH_POLICIES))
        def health_policy(self, route: int, policy: str) -> None:
            self._answered(api.post(f"/api/v1/routes/{self.routes[route]}/health-policy/",
                                    {"health_policy": policy}, format="json"))

        @rule(name=st.sampled_from(NAMES), pick=st.integers(0, 15))
        def flip_health(self, name: str, pick: int) -> None:
            """The probe fails a healthy pool enough times to flip it unhealthy, or succeeds
            on an unhealthy one enough to bring it back; the policy's drains or restores are
            applied here and pushed, as the worker's traffic.health_policy task (queued by
            the flip) does too: a flip is acted on once, whichever gets there first."""
            pool = Pool.objects.filter(name=self._pick_pool(pick, name)).first()
            if pool is None:
                return
            healthy = pool.health_state == Pool.Health.UNHEALTHY
            before = (HealthTransition.objects.filter(pool=pool).order_by("-id")
                      .values_list("id", flat=True).first()) or 0
            times = (settings.HEALTH_SUCCESSES_TO_HEALTHY if healthy
                     else settings.HEALTH_FAILURES_TO_UNHEALTHY)
            for _ in range(times):
                pool_health_record(pool_id=pool.pk, ok=healthy,
                                   status_code=200 if healthy else None,
                                   latency_ms=1.0 if healthy else None,
                                   error="" if healthy else "fuzz")
            flip = HealthTransition.objects.filter(pool=pool, id__gt=before).order_by("-id") \
                .first()
            if flip is not None:
                for drain in policy_apply(transition_id=flip.pk):
                    drain_push_now(drain)

        # --- after every step ---------------------------------------------------------------------
        @invariant()
        def pinned_traffic_stays_in_its_jurisdiction(self) -> None:
            if not hasattr(self, "n"):
                return
            # At once (the gateway may still hold the previous state, which must be safe under
            # the registry as it is now), then once the pushes have landed.
            found = crossings(gateway, settled=False) + mirror_crossings(gateway, settled=False)
            # The stage rules: the stored state at once (a plan's move and its drain are one
            # transaction), what Envoy holds once the pushes have landed.
            found += stage_breaches(selectors.gateway_desired_state(gateway=gateway)
                                    .held_weights(), "desired state")
            settle(gateway)
            view = envoy_view(gateway)
            found += crossings(gateway, settled=True, view=view) + \
                mirror_crossings(gateway, settled=True)
            found += stage_breaches(view[0], "Envoy")
            self._found(found)

    return RegistryAndTraffic


