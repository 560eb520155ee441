"""Seed the demo fleet: five regions in four jurisdictions, pools on four vendors (one
primary and one candidate for the same model), and one person per role.

Safe to re-run, and a re-run never undoes what people did since: the rule is **never modify
an existing object**. Each demo object (region, pool with its model entry, person, trace,
route, gateway with its routes, plan, the MI300X plan's shadow run, a plan's eval run, the
TPU's share of llama-8b (demo/tier_share.py), the guarded ramp of the Gaudi pool on
llama-8b, the A100 plan's batch input file, weight on its batch route and soak) is created
only when nothing of that name exists; one that exists is left exactly as it is, whatever
changed in it. Creating goes through the same services as the API, so a refusal
there (the fleet changed so that a demo object no longer fits) is reported and that object
skipped; the seed never crashes on data the API allowed."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from django.contrib.auth.models import User
from django.core.exceptions import ObjectDoesNotExist
from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.management.base import BaseCommand, CommandParser
from django.db import transaction

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import roles_ensure_groups, user_set_roles
from fleetctl.core.errors import DomainError
from fleetctl.core.files import write_atomically
from fleetctl.fleet import services
from fleetctl.fleet.models import Pool, Region

if TYPE_CHECKING:
    from fleetctl.traffic.models import Route
    from migrations_plan.models import Plan

T = TypeVar("T")

REGIONS = [
    ("us-east", "US East (Virginia)", "US"),
    ("eu-west", "EU West (Ireland)", "EU"),
    ("eu-central", "EU Central (Frankfurt)", "EU"),
    ("in-west", "India West (Mumbai)", "IN"),
    ("uk-south", "UK South (London)", "UK"),
]
MODEL = "llama-3.1-8b-instruct"
# name, runtime, runtime version, accelerator, region, port offset, hourly rate, latency class,
# labels, max context (tokens: what its simulated servers serve, sim/profiles.py — the
# registry tells the truth, so the context tiers rest on it)
POOLS: list[tuple[str, str, str, str, str, int, str, str, dict[str, str], int]] = [
    ("h200-us-east", "cuda", "vllm-0.11/cuda-12.8", "H200", "us-east", 1, "39.80",
     "interactive", {"role": "primary", "driver": "570.86"}, 32768),
    ("mi300x-us-east", "rocm", "vllm-0.11/rocm-6.4", "MI300X", "us-east", 2, "31.20",
     "interactive", {"role": "candidate", "driver": "rocm-6.4"}, 32768),
    ("tpu-v5e-eu-west", "tpu", "jetstream-0.3", "TPU v5e", "eu-west", 3, "9.60",
     "standard", {"topology": "2x4"}, 8192),
    ("a100-eu-central", "cuda", "vllm-0.11/cuda-12.4", "A100 80GB", "eu-central", 4, "14.70",
     "batch", {"generation": "previous"}, 16384),
    ("gaudi3-in-west", "gaudi", "tgi-gaudi-2.3", "Gaudi 3", "in-west", 5, "18.40",
     "standard", {"driver": "1.20"}, 32768),
]
# Interruptible pools and their reclaim model (fleet/interruption.py): the A100s are spot
# capacity for batch work, expected to be reclaimed about twice a week, with 10 % standby kept
# to absorb a reclaim. The seed's soak on them opens with a kill-worker drill: once it passes,
# its re-warm and resent requests price the tax, and every cost of the A100 includes it (its
# soak's cost arbitrage: ~12.7 USD ≈ 11.8 EUR per 1M bare, ~+10 % with the tax, still within
# the plan's 15.00 EUR); until then its costs read "not measured: run a drill".
INTERRUPTIBLE: dict[str, dict[str, str]] = {
    "a100-eu-central": {"reclaims_per_month": "8", "standby_pct": "10"},
}
# More endpoints of a pool (port offsets, as in devstack.DEMO_SIM_POOLS): the H200 primary has
# two replicas, so a shadow run's secondary answer comes from another replica (noise floor).
EXTRA_ENDPOINTS: dict[str, tuple[int, ...]] = {"h200-us-east": (6,)}
PEOPLE = [("admin", "admin"), ("lead", "platform-lead"), ("lead2", "platform-lead"),
          ("oncall", "on-call"), ("viewer", "viewer")]
ROUTES = [("llama-8b", "", "h200-us-east"), ("llama-8b-eu", "EU", "tpu-v5e-eu-west")]
# Context tiers of llama-8b: short prompts fail over across vendors (the TPU and the A100
# serve them too), long ones queue for the 32k pools rather than spill to a smaller one, and
# a prompt above 32k is refused with 413 (no demo pool serves it).
TIERS_ROUTE = "llama-8b"
TIERS: list[dict[str, Any]] = [
    {"max_prompt_tokens": 8192, "behaviour": "failover"},
    {"max_prompt_tokens": 32768, "behaviour": "queue", "queue_max": 64, "retry_after_s": 5},
    {"behaviour": "reject"},
]
# The demo Prometheus labels every pool's scrape job `pool` (devstack.demo_prometheus): the seed
# makes it a telemetry source with this selector.
DEMO_TELEMETRY_SELECTOR = 'pool="$pool"'
GATEWAY = "envoy-demo"
GATEWAY_KINDS = ("envoy-xds", "envoy")
# The file Envoy writes in its working directory (demo/envoy_process.py), which the telemetry
# ingester follows: the gateway's `access_log` option.
ACCESS_LOG = "access.log"
# The MI300X plan's stage-4 ramp check asks its first live step to hold this many minutes
# (production's default: 7 days), and says so in its title.
DEMO_FIRST_STEP_MIN = 10
# The guarded ramp: the Gaudi pool (in no plan) stepped up on llama-8b, judged live. The demo
# traffic sends 4 requests/s, nearly all streamed: at 5 % that is ~0.2 streamed answers a second
# to the Gaudi pool, ~16 in a 90 s hold, above min_samples. The guard's window is the hold's
# length: a 60 s one held 9–11 streamed answers at 5 % (measured), too few to judge inside the
# hold, so a fault waited for the hold's end (74 s); at 50 % it holds ~160. The ramp completes
# at 50 % after ~6.5 minutes and hands over to a standing live watch of the Gaudi pool (policy
# drain) and the H200 (alert), judging 90 s windows: someone slowing the pool then (`fleetctl
# sim fault … --added-latency-ms 300`) has it drained after two failing windows.
# Thresholds (no plan, so given): the simulated Gaudi answers its first token in ~20–40 ms and
# a token every ~16 ms; the H200 primary is faster, hence the 100 % margin.
# Stage 3 (batch) of the A100 plan: a batch-latency route of the model (primary the H200),
# on which the stage-3 candidate may carry weight, and a short soak on the A100 — a job of
# ~200 chat requests every 60 s for 8 minutes, its first with a kill-worker drill at 40 % —
# so the plan's soak, checkpoint-resume and cost-arbitrage checks fill in within minutes of
# `make demo` (the demo's two batch workers run the jobs; beat's batch.tick drives the soak).
# The predicted cost is a planning figure in EUR, compared with the cost measured in the
# pool's USD through a dated rate the seed states (never two currencies as one number). At
# concurrency 8 the simulated A100 gives ~320 output tok/s on a busy laptop (~56 s a job):
# 14.70 USD/h / (320 × 3600) × 1e6 ≈ 12.7 USD ≈ 11.8 EUR per 1M, within the 15.00 EUR plan.
BATCH_ROUTE = "llama-8b-batch"
BATCH_POOL = "a100-eu-central"
BATCH_WEIGHT = 20  # % of the batch route on the A100; the rest stays on the H200
BATCH_INPUT = "demo-batch-chat.jsonl"
BATCH_REQUESTS = 200
BATCH_PREDICTION = {"predicted_cost_per_1m": "15.00", "predicted_cost_currency": "EUR",
                    "predicted_cost_source": "the FY27 capacity plan (demo): A100 batch "
                                             "nodes at 15 EUR per 1M output tokens"}
BATCH_RATE = {"from_currency": "EUR", "to_currency": "USD", "rate": "1.08",
              "source": "demo: the planning rate of the FY27 capacity plan"}
SOAK: dict[str, Any] = {"every_s": 60, "duration_s": 8 * 60, "concurrency": 8,
                        "drill": "kill-worker"}
RAMP_ROUTE = "llama-8b"
RAMP_POOL = "gaudi3-in-west"
RAMP: dict[str, Any] = {
    "steps": [{"percent": 5, "hold_s": 90}, {"percent": 10, "hold_s": 90},
              {"percent": 25, "hold_s": 90}, {"percent": 50, "hold_s": 120}],
    "min_samples": 10, "window_s": 90, "failure_threshold": 2,
    "slo_ttft_p95_ms": 250.0, "slo_tpot_p95_ms": 60.0, "slo_error_rate": 0.02,
    "latency_margin_pct": 100.0,
}


def _reason(exc: Exception) -> str:
    if isinstance(exc, DjangoValidationError):
        return "; ".join(exc.messages)
    return str(exc)


class Command(BaseCommand):
    help = ("Create the demo fleet and demo users: each object only if absent; existing ones "
            "are never modified.")

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--password", required=True, help="password for new demo users")
        parser.add_argument("--sim-base-port", type=int, default=8100)
        parser.add_argument("--gateway-admin", default="",
                            help="Envoy admin URL; with it, routes and a gateway are seeded")
        parser.add_argument("--gateway-kind", choices=GATEWAY_KINDS, default="envoy-xds",
                            help="a new gateway's kind: envoy-xds (Envoy fed over xDS by "
                                 "fleetctl, the default) or envoy (files and admin API)")
        parser.add_argument("--gateway-dir", "--gateway-config-dir", dest="gateway_dir",
                            default="", help="the Envoy's working directory: its access.log "
                                             "(either kind) and CDS/RDS files (kind envoy)")
        parser.add_argument("--gateway-token-file", default="",
                            help="kind envoy-xds: where the gateway's xDS token is kept "
                                 "(mode 0600); one there that still works is kept, else a "
                                 "new one is issued and written")
        parser.add_argument("--gateway-listen", default="",
                            help="the Envoy's listen_url (the routing probe sends there)")
        parser.add_argument("--conformance", action="store_true",
                            help="queue a conformance probe of each demo plan's candidate "
                                 "(a worker on the probe queue runs it once the pools answer)")
        parser.add_argument("--prometheus-url", default="",
                            help="the demo's Prometheus (devstack starts it when installed): "
                                 "registered as the metric source `prometheus`, and the "
                                 "seeded ramp's guard lists a query against it")
        parser.add_argument("--evals", action="store_true",
                            help="install the bundled eval suites and queue an eval run of each "
                                 "demo plan's candidate against its primary (a worker on the "
                                 "evals queue runs it once the pools answer)")

    def handle(self, *args: Any, **options: Any) -> None:
        self.created: list[str] = []
        actor = Actor.for_system("demo-seed")
        for code, name, jurisdiction in REGIONS:
            if not Region.objects.filter(code=code).exists():
                self._create(f"region {code}", partial(
                    services.region_create, actor=actor, code=code, name=name,
                    jurisdiction=jurisdiction))
        for spec in POOLS:
            self._pool(actor, spec, options["sim_base_port"])
        self._people(actor, options["password"])
        from fleetctl.demo.traces import seed_traces
        seed_traces(actor, self._create)
        if options["gateway_admin"]:
            self._traffic(actor, options["gateway_admin"], options["gateway_dir"],
                          options["gateway_listen"], options["gateway_kind"])
            if options["gateway_token_file"]:
                self._token(Path(options["gateway_token_file"]))
            self._plans()
            if options["conformance"]:
                self._probe()
            if options["evals"]:
                self._evals()
            self._shadow()
            from fleetctl.demo.tier_share import seed_tier_share
            self.created += seed_tier_share(note=self._note)  # before the ramp takes its base
            self._ramp(self._metric_source(options["prometheus_url"]))
            self._batch()
            from fleetctl.schedules.demo import seed_demo_schedules
            self.created += seed_demo_schedules(note=self._note)
            from fleetctl.demo.capacity_run import seed_capacity_run
            self.created += seed_capacity_run(note=self._note)
            from fleetctl.demo.business_case import seed_business_case
            self.created += seed_business_case(note=self._note)
        made = ", ".join(self.created) if self.created else "nothing (all there already)"
        self.stdout.write(f"demo fleet: {Pool.objects.count()} pools in "
                          f"{Region.objects.count()} regions; created {made}")

    def _create(self, what: str, create: Callable[[], T]) -> T | None:
        """One demo object, in its own transaction. The services refuse what the API would
        refuse (and a dependency may be gone): say so and go on without it."""
        try:
            with transaction.atomic():
                made = create()
        except (DjangoValidationError, DomainError, ObjectDoesNotExist) as exc:
            self.stderr.write(f"demo seed: {what} not created: {_reason(exc)}")
            return None
        self.created.append(what)
        return made

    def _note(self, message: str) -> None:
        self.stderr.write(f"demo seed: {message}")

    def _pool(self, actor: Actor, spec: tuple[str, str, str, str, str, int, str, str,
                                                dict[str, str], int], sim_base_port: int) -> None:
        name, runtime, version, accel, region, offset, rate, latency, labels, context = spec
        urls = [f"http://127.0.0.1:{sim_base_port + port}"
                for port in (offset, *EXTRA_ENDPOINTS.get(name, ()))]
        pool = Pool.objects.filter(name=name).first()
        if pool is not None:
            if missing := [url for url in urls if url not in pool.base_urls]:
                self._note(f"pool {name} is kept as it is: it does not point at its simulated "
                           f"pool {', '.join(missing)} (edit its base URLs to send it there)")
            return

        def create() -> Pool:
            # The pool and its model entry are one demo object: both or neither.
            made = services.pool_create(
                actor=actor, name=name, runtime=runtime, runtime_version=version,
                accelerator=accel, region=Region.objects.get(code=region), base_urls=urls,
                latency_class=latency, max_context_tokens=context, node_hourly_rate=rate,
                currency="USD", labels=labels,
                **({"interruptible": True, **INTERRUPTIBLE[name]} if name in INTERRUPTIBLE
                   else {}),
            )
            services.pool_model_create(
                actor=actor, pool=made, model_id=MODEL, revision="0e9e39f",
                quantisation="fp8" if runtime in ("cuda", "rocm") else "bf16",
                weight_format="safetensors", max_context_tokens=context,
            )
            return made

        self._create(f"pool {name}", create)

    def _traffic(self, actor: Actor, admin_url: str, workdir: str, listen_url: str,
                 kind: str = "envoy-xds") -> None:
        """Two routes through one Envoy: the model, all on the H200 primary with the MI300X
        candidate ready at 0 %, and the same model pinned to the EU. The gateway is of
        `kind`: envoy-xds (its Envoy gets clusters, routes and weights over xDS from
        fleetctl) or envoy (CDS/RDS files in `workdir` and the admin API). An existing
        gateway keeps its routes and its kind: after a restart Envoy gets its configuration
        again (from the xDS server, or from its files) and reconcile re-pushes whatever
        differs."""
        from fleetctl.traffic import services as traffic
        from fleetctl.traffic.models import Gateway, Route

        for name, pin, primary in ROUTES:
            if not Route.objects.filter(name=name).exists():
                self._create(f"route {name}", partial(self._route, actor, name, pin, primary))
        tiered = Route.objects.filter(name=TIERS_ROUTE).first()
        if tiered is not None and not tiered.context_tiers.exists():
            self._create(f"context tiers of {TIERS_ROUTE}", partial(
                traffic.route_tiers_set, actor=actor, route=tiered, tiers=TIERS))
        if not Route.objects.filter(name=BATCH_ROUTE).exists():
            self._create(f"route {BATCH_ROUTE}", partial(
                self._route, actor, BATCH_ROUTE, "", "h200-us-east", latency_class="batch"))
        gateway = Gateway.objects.filter(name=GATEWAY).first()
        options: dict[str, Any] = {"listen_url": listen_url} if listen_url else {}
        if kind == "envoy":
            options["config_dir"] = workdir
        if workdir:
            options["access_log"] = str(Path(workdir) / ACCESS_LOG)
        if gateway is None:
            routes = list(Route.objects.filter(
                name__in=[*[name for name, _, _ in ROUTES], BATCH_ROUTE]))
            self._create(f"gateway {GATEWAY}", lambda: traffic.gateway_create(
                actor=actor, name=GATEWAY, kind=kind, admin_address=admin_url,
                options=options, routes=routes))
        elif gateway.kind != kind:
            self._note(f"gateway {GATEWAY} is kept as it is: it is of kind {gateway.kind}, "
                       f"so this demo runs its Envoy as that kind wants, not as {kind} (a "
                       f"new data directory seeds it as {kind})")
        elif gateway.admin_address != admin_url \
                or gateway.options.get("config_dir") != options.get("config_dir"):
            where = (f"{admin_url}, {workdir}" if kind == "envoy" else admin_url)
            now = (f"{gateway.admin_address} ({gateway.options.get('config_dir')})"
                   if kind == "envoy" else gateway.admin_address)
            self._note(f"gateway {GATEWAY} is kept as it is: it points at {now}, not at the "
                       f"Envoy this demo starts ({where}); edit the gateway to carry traffic "
                       f"through this one")
        elif workdir and not gateway.options.get("access_log"):
            # A gateway seeded before live telemetry: kept as it is, like every demo object.
            self._note(f"gateway {GATEWAY} is kept as it is: it has no access_log option, so "
                       f"the telemetry ingester reads nothing from it and the seeded ramp's "
                       f"guard waits; set access_log to {options['access_log']} on the "
                       f"gateway (edit it on its page, or PATCH /api/v1/gateways/…)")

    def _token(self, path: Path) -> None:
        """The xDS token of the demo's gateway, where the devstack reads it for Envoy's
        bootstrap: one in `path` that still works (its hash is the gateway's) is kept, so a
        restarted demo does not rotate it; otherwise a new one is issued (audited) and
        written, mode 0600. A gateway of another kind has no token: the file is removed, so
        the devstack runs that gateway's Envoy without xDS."""
        from fleetctl.accounts.selectors import secret_hash
        from fleetctl.traffic.models import Gateway
        from fleetctl.xds.models import XdsGateway
        from fleetctl.xds.services import gateway_token_issue

        gateway = Gateway.objects.filter(name=GATEWAY).first()
        if gateway is None or gateway.kind != "envoy-xds":
            path.unlink(missing_ok=True)
            return
        held = path.read_text().strip() if path.exists() else ""
        if held and XdsGateway.objects.filter(name=GATEWAY,
                                              token_sha256=secret_hash(held)).exists():
            return
        token = gateway_token_issue(gateway=GATEWAY, actor=Actor.for_system("demo-seed"))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, token + "\n")  # a temporary file's mode: 0600
        path.chmod(0o600)
        self.created.append(f"xDS token of {GATEWAY}")

    @staticmethod
    def _route(actor: Actor, name: str, pin: str, primary: str,
               latency_class: str = "") -> Route:
        from fleetctl.traffic import services as traffic

        # The pools have not been probed yet when the demo starts; the seed forces (audited).
        return traffic.route_create(actor=actor, name=name, model_id=MODEL, residency=pin,
                                    latency_class=latency_class,
                                    primary_pool=Pool.objects.get(name=primary), force=True,
                                    reason="demo seed (pools not probed yet)")

    def _plans(self) -> None:
        """Two plans, both opened by `lead` so that `lead2` is the second platform lead:
        MI300X in stage 2 (shadow) with a partly green gate, and the A100 in stage 3 (batch),
        signed off by `lead2` on what the seed had (stages 1 and 2 with a justification), with
        a predicted cost, whose soak fills in its stage-3 checks (`_batch`).
        Every step goes through the services, so each plan's timeline shows it; a plan is
        seeded whole or not at all."""
        from migrations_plan.models import Plan

        if not Plan.objects.filter(name="mi300x-llama-8b").exists():
            self._create("plan mi300x-llama-8b", self._plan_mi300x)
        if not Plan.objects.filter(name="a100-llama-8b").exists():
            self._create("plan a100-llama-8b", self._plan_a100)

    def _plan_terms(self) -> dict[str, Any]:
        from fleetctl.traffic.models import Route

        return {"primary_pool": Pool.objects.get(name="h200-us-east"),
                "routes": [Route.objects.get(name="llama-8b")],
                "slo_ttft_p95_ms": 800, "slo_tpot_p95_ms": 60, "slo_error_rate": 0.01}

    def _plan_mi300x(self) -> Plan:
        from migrations_plan import services as plans

        lead = Actor(user=User.objects.get(username="lead"))
        lead2 = Actor(user=User.objects.get(username="lead2"))
        plan = plans.plan_create(
            actor=lead, name="mi300x-llama-8b",
            candidate_pool=Pool.objects.get(name="mi300x-us-east"), **self._plan_terms(),
            notes="Move llama-8b interactive traffic from H200 to MI300X (demo).")
        plans.approve(actor=lead2, plan=plan, justification=(
            "Demo seed: stage 1 approved before any evidence exists, to start the tour in "
            "stage 2; the conformance probe queued at start shows what a real stage 1 "
            "gathers."))
        plan = plans.advance(actor=lead2, plan=plan, reason="stage 1 signed off")
        plans.check_add(actor=lead, plan=plan, stage=2, title="", rule="pool.healthy_for",
                        params={"hours": 0.1})
        plans.check_add(actor=lead, plan=plan, stage=2, title="",
                        rule="routing.only_through_route")
        # Spans a demo can show in minutes, said so in the check's title.
        ramp = plan.checks.get(stage=4, key="ramp-slo")
        plans.check_update(actor=lead, check=ramp, params={
            **ramp.params, "first_step_min_days": DEMO_FIRST_STEP_MIN / 1440},
            title=f"{ramp.title} (demo span: first step ≥ {DEMO_FIRST_STEP_MIN} min; 7 days "
                  f"in production)")
        return plan

    def _plan_a100(self) -> Plan:
        """Opened by `lead` on llama-8b and its batch route, then moved into stage 3 through
        the gates by `lead2` (attestation by `lead`, approvals with a justification, as for
        the MI300X plan), and given its predicted cost by `lead`: entering stage 3 records
        the candidate's benchmark cost when it has one, and the demo's A100 has none yet.
        The latency margin is 25 %: the soak's jobs share a laptop with the demo's traffic,
        evals and shadow run, and must not fail on that noise (a job must keep 75 % of the
        first job's throughput)."""
        from fleetctl.traffic.models import Route
        from migrations_plan import services as plans

        lead = Actor(user=User.objects.get(username="lead"))
        lead2 = Actor(user=User.objects.get(username="lead2"))
        terms = self._plan_terms()
        terms["routes"] = [*terms["routes"], Route.objects.get(name=BATCH_ROUTE)]
        a100 = Pool.objects.get(name=BATCH_POOL)
        plan = plans.plan_create(actor=lead, name="a100-llama-8b", candidate_pool=a100,
                                 latency_margin_pct=25, **terms,
                                 notes="Previous-generation A100s for batch traffic (demo).")
        plans.approve(actor=lead2, plan=plan, justification=(
            "Demo seed: stage 1 approved before any evidence exists (the A100s take batch "
            "work only); the conformance probe queued at start shows what it gathers."))
        plan = plans.advance(actor=lead2, plan=plan, reason="stage 1 signed off")
        plans.attest(actor=lead, check=plan.checks.get(stage=2, key="dashboards"),
                     note="Demo: the batch dashboards and alerts exist")
        plans.approve(actor=lead2, plan=plan, justification=(
            "Demo: batch work is offline; the shadow and benchmark evidence is waived for "
            "the batch stage's soak to show what the candidate does."))
        plan = plans.advance(actor=lead2, plan=plan, reason="into batch: soak the A100s")
        # The soak's span, measured on the clock as in production, shortened to the demo
        # soak's length and said so in the check's title.
        soak = plan.checks.get(stage=3, key="soak")
        minutes = SOAK["duration_s"] // 60
        plans.check_update(actor=lead, check=soak,
                           params={**soak.params, "min_days": minutes / 1440},
                           title=f"Batch soak of {minutes} min with no manual intervention "
                                 f"(demo span; 7 days in production)")
        return plans.plan_update(actor=lead, plan=plan, **BATCH_PREDICTION)

    def _probe(self) -> None:
        """A real conformance probe of each demo plan's candidate against its primary, queued
        on every start: the probe queue's worker runs it against the simulated pools (the
        A100 runs the legacy serving profile: no tool parsing, another tokenizer, so its
        run fails; the MI300X's passes). A plan whose candidate is being probed already, or
        that is gone, is skipped with a note."""
        from fleetctl.conformance import services as conformance
        from migrations_plan.models import Plan

        actor = Actor.for_system("demo-seed")
        for name in ("a100-llama-8b", "mi300x-llama-8b"):
            plan = Plan.objects.filter(name=name).select_related("candidate_pool").first()
            if plan is None:
                continue
            self._create(f"conformance run of {plan.candidate_pool.name}", partial(
                conformance.run_create, actor=actor, pool=plan.candidate_pool, plan=plan))

    def _evals(self) -> None:
        """The bundled suites, and a real eval run of each demo plan's candidate against its
        primary on `fleetctl-core` (1,200 items on two pools), started by `lead`: the evals
        worker runs both within a few minutes of `make demo`, and each plan's stage-2 eval
        check reads the measured verdict. The MI300X answers as well as the H200 (the
        simulator's task accuracy is 0.92 on both) and passes; the A100's legacy stack answers
        fewer items right and fails, so a failing verdict, its interval and the items that
        changed are there to read too. Created once per plan, like the shadow run: a plan
        with an eval run queued, running or complete gets no new one (a cancelled or failed
        one is replaced on the next start)."""
        from fleetctl.evals import bundled
        from fleetctl.evals import services as evals
        from fleetctl.evals.models import EvalRun
        from migrations_plan.models import Plan

        installed = evals.suite_install_bundled(actor=Actor.for_system("demo-seed"))
        suite = next((s for s in installed if s.name == bundled.MIX), None)
        if suite is None:
            self._note(f"suite {bundled.MIX} was not installed: no eval runs queued")
            return
        lead = Actor(user=User.objects.get(username="lead"))
        keep = (*EvalRun.ACTIVE, EvalRun.Status.COMPLETE)
        for name in ("mi300x-llama-8b", "a100-llama-8b"):
            plan = Plan.objects.filter(name=name).first()
            if plan is None or EvalRun.objects.filter(plan=plan, status__in=keep).exists():
                continue
            # Concurrency 16 each: the two runs share a 2-core laptop with the simulated fleet
            # and the demo's shadow traffic (the pools batch 16 sequences at ~10 ms a step),
            # and finish within about a minute.
            self._create(f"eval run of {name}", partial(
                evals.run_create, actor=lead, suite=suite, candidate=plan.candidate_pool,
                primary=plan.primary_pool, plan=plan, concurrency=16))

    def _shadow(self) -> None:
        """A mirror shadow run for the MI300X plan (stage 2, "shadow"), started by `lead`:
        every request of the llama-8b route is copied to the collector and answered by the
        H200 (twice: two replicas, the noise floor) and the MI300X. The demo's traffic (2
        requests/s) reaches min_pairs in about 100 s, so the plan's divergence check goes from
        insufficient data to a measured verdict within a few minutes of `make demo`. Like
        every demo object it is created once: a plan that has a shadow run (running, or
        stopped by someone since) gets no new one."""
        from fleetctl.shadow import services as shadow
        from fleetctl.shadow.models import ShadowRun
        from fleetctl.traffic.models import Route
        from migrations_plan.models import Plan

        plan = Plan.objects.filter(name="mi300x-llama-8b").first()
        if plan is None:
            return
        if ShadowRun.objects.filter(plan=plan).exists():
            if not ShadowRun.objects.filter(plan=plan, status="running").exists():
                self._note("plan mi300x-llama-8b keeps its stopped shadow run (start another "
                           "on the plan page or with `fleetctl shadow start`)")
            return
        self._create("shadow run of mi300x-llama-8b", lambda: shadow.run_create(
            actor=Actor(user=User.objects.get(username="lead")), plan=plan, mode="mirror",
            route=Route.objects.get(name="llama-8b"), sample_percent=100, max_rps=3,
            content="redacted", min_pairs=200))

    def _ramp(self, source: str = "") -> None:
        """A guarded ramp of the Gaudi pool on llama-8b, started by `lead`: the controller
        (beat's `ramps.tick` on the watch queue) sets 5 %, waits for the ingester's telemetry
        (it never advances without samples, so it does not matter that Envoy gets the route
        a few seconds after the seed), holds, judges, steps up to 50 % and completes; a
        standing watch of each pool with weight takes over (ramps/services/watch.py).
        Created once, like the shadow run: a route that has had a ramp of this pool (running,
        complete, rolled back or aborted since) gets no new one.

        The pool is probed once first when its health is still unknown (the probe worker
        would do it within seconds): a ramp's first step refuses a pool not known healthy."""
        from fleetctl.fleet.tasks import pool_probe
        from fleetctl.ramps import services as ramps
        from fleetctl.ramps.models import Ramp
        from fleetctl.traffic.models import Route

        route = Route.objects.filter(name=RAMP_ROUTE).first()
        pool = Pool.objects.filter(name=RAMP_POOL).first()
        if route is None or pool is None:
            return
        if Ramp.objects.filter(route=route, pool=pool).exists():
            if not Ramp.objects.filter(route=route, pool=pool, state="running").exists():
                self._note(f"route {RAMP_ROUTE} keeps its finished ramp of {RAMP_POOL} (start "
                           f"another on the route page or with `fleetctl ramp start`)")
            return
        if pool.health_state == Pool.Health.UNKNOWN:
            pool_probe(pool.pk)
        # Beside its own telemetry, the guard asks Prometheus for the pool's queue (vLLM's
        # gauge, scraped from the pool): a long queue fails the check, no answer waits.
        metrics = [{"source": source, "name": "queue depth (Prometheus)",
                    "query": 'sum(vllm:num_requests_waiting{pool="$pool"})',
                    "success": "result < 32"}] if source else []
        self._create(f"ramp of {RAMP_POOL} on {RAMP_ROUTE}", lambda: ramps.ramp_create(
            actor=Actor(user=User.objects.get(username="lead")), route=route, pool=pool,
            reason="demo: Gaudi 3 takes a share of llama-8b, guarded by live telemetry"
                   + (" and a Prometheus query" if metrics else ""),
            metric_checks=metrics, **RAMP))

    def _metric_source(self, url: str) -> str:
        """The demo's Prometheus as the metric source `prometheus` (by the administrator),
        or "" without one. It is a telemetry source too (its scrape jobs label each pool
        `pool`): the pool page shows each pool's latency "from Prometheus prometheus" beside
        the access logs'."""
        if not url:
            return ""
        from fleetctl.prometheus import services as prometheus
        from fleetctl.prometheus.models import MetricSource

        admin = Actor(user=User.objects.get(username="admin"))
        found = MetricSource.objects.filter(name="prometheus").first()
        if found is None:
            self._create("metric source prometheus", lambda: prometheus.source_create(
                actor=admin, name="prometheus", base_url=url,
                telemetry_selector=DEMO_TELEMETRY_SELECTOR))
        elif (found.base_url, found.telemetry_selector) != (url, DEMO_TELEMETRY_SELECTOR):
            prometheus.source_update(actor=admin, source=found, base_url=url,
                                     telemetry_selector=DEMO_TELEMETRY_SELECTOR)
        return "prometheus" if MetricSource.objects.filter(name="prometheus").exists() else ""

    def _batch(self) -> None:
        """Stage 3 of the A100 plan: `lead` gives the A100 BATCH_WEIGHT % of the batch route
        (a stage-3 candidate may carry its plan's batch-class routes), the seed states the
        EUR→USD rate the cost arbitrage converts with, uploads the batch input file
        (BATCH_REQUESTS chat requests of the demo's prompts) and `lead` starts the soak.
        Each only once, like every demo object: a route that ever gave the A100 weight, an
        existing EUR/USD rate, a file of that name and a plan that has had a soak are kept."""
        from fleetctl.fleet.models import CurrencyRate
        from fleetctl.traffic.models import Route
        from migrations_plan.models import Plan

        plan = Plan.objects.filter(name="a100-llama-8b").first()
        if plan is None:
            return
        if plan.state != Plan.State.STAGE_3:
            if not plan.soaks.exists():
                self._note(f"plan a100-llama-8b is kept as it is ({plan.get_state_display()}): "
                           f"no soak is started (a soak runs at stage 3)")
            return
        route = Route.objects.filter(name=BATCH_ROUTE).first()
        if route is not None and not any(BATCH_POOL in revision.weights
                                         for revision in route.revisions.all()):
            self._create(f"{BATCH_WEIGHT} % of {BATCH_ROUTE} on {BATCH_POOL}",
                         partial(self._batch_weight, route))
        if not CurrencyRate.objects.filter(
                from_currency__in=("EUR", "USD"), to_currency__in=("EUR", "USD")).exists():
            self._create("EUR/USD rate", self._batch_rate)
        if not plan.soaks.exists():
            self._create("soak of a100-llama-8b", partial(self._batch_soak, plan))

    @staticmethod
    def _batch_weight(route: Route) -> Any:
        from fleetctl.traffic import services as traffic

        return traffic.revision_create(
            actor=Actor(user=User.objects.get(username="lead")), route=route,
            base_revision=route.revision_number,
            weights={route.primary_pool.name: 100 - BATCH_WEIGHT, BATCH_POOL: BATCH_WEIGHT},
            force=True, reason="demo: the A100s take a share of batch traffic in stage 3 "
                               "(pools not probed yet)")

    @staticmethod
    def _batch_rate() -> Any:
        from django.utils import timezone

        return services.currency_rate_create(actor=Actor.for_system("demo-seed"),
                                             as_of=timezone.localdate(), **BATCH_RATE)

    @staticmethod
    def _batch_soak(plan: Plan) -> Any:
        import io
        import json

        from fleetctl.batch import services as batch
        from fleetctl.batch.models import BatchFile
        from fleetctl.batch.soak import soak_create
        from fleetctl.demo.traffic import PROMPTS

        input_file = (BatchFile.objects.filter(name=BATCH_INPUT, deleted_at__isnull=True)
                      .order_by("-id").first())
        if input_file is None:
            lines = [json.dumps({
                "custom_id": f"demo-{i:04d}", "method": "POST", "url": "/v1/chat/completions",
                "body": {"model": MODEL, "max_tokens": 128, "messages": [
                    {"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]}})
                for i in range(BATCH_REQUESTS)]
            input_file = batch.file_upload(actor=Actor.for_system("demo-seed"),
                                           name=BATCH_INPUT,
                                           stream=io.BytesIO("\n".join(lines).encode()))
        return soak_create(actor=Actor(user=User.objects.get(username="lead")), plan=plan,
                           input_file=input_file, **SOAK)

    def _people(self, actor: Actor, password: str) -> None:
        roles_ensure_groups()
        for username, role in PEOPLE:
            user = User.objects.filter(username=username).first()
            if user is None:
                self._create(f"user {username}",
                             partial(self._person, actor, username, role, password))
            elif not user.check_password(password):
                self._note(f"user {username} keeps the password it was given since "
                           f"(not the demo password)")

    @staticmethod
    def _person(actor: Actor, username: str, role: str, password: str) -> User:
        # People and roles are managed on the People page (/people/), not the Django admin.
        user = User.objects.create_user(username=username, password=password)
        user_set_roles(actor=actor, username=username, role_names=[role])
        return user
