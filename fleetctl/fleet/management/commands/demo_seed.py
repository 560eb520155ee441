"""Seed the demo fleet: five regions in four jurisdictions, pools on four vendors (one
primary and one candidate for the same model), and one person per role. Safe to re-run."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import User
from django.core.management.base import BaseCommand, CommandParser

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.services import roles_ensure_groups, user_set_roles
from fleetctl.fleet import services
from fleetctl.fleet.models import Pool, PoolModel, Region

REGIONS = [
    ("us-east", "US East (Virginia)", "US"),
    ("eu-west", "EU West (Ireland)", "EU"),
    ("eu-central", "EU Central (Frankfurt)", "EU"),
    ("in-west", "India West (Mumbai)", "IN"),
    ("uk-south", "UK South (London)", "UK"),
]
MODEL = "llama-3.1-8b-instruct"
# name, runtime, runtime version, accelerator, region, port offset, hourly rate, latency class,
# labels, role in the demo
POOLS: list[tuple[str, str, str, str, str, int, str, str, dict[str, str]]] = [
    ("h200-us-east", "cuda", "vllm-0.11/cuda-12.8", "H200", "us-east", 1, "39.80",
     "interactive", {"role": "primary", "driver": "570.86"}),
    ("mi300x-us-east", "rocm", "vllm-0.11/rocm-6.4", "MI300X", "us-east", 2, "31.20",
     "interactive", {"role": "candidate", "driver": "rocm-6.4"}),
    ("tpu-v5e-eu-west", "tpu", "jetstream-0.3", "TPU v5e", "eu-west", 3, "9.60",
     "standard", {"topology": "2x4"}),
    ("a100-eu-central", "cuda", "vllm-0.11/cuda-12.4", "A100 80GB", "eu-central", 4, "14.70",
     "batch", {"generation": "previous"}),
    ("gaudi3-in-west", "gaudi", "tgi-gaudi-2.3", "Gaudi 3", "in-west", 5, "18.40",
     "standard", {"driver": "1.20"}),
]
PEOPLE = [("admin", "admin"), ("lead", "platform-lead"), ("lead2", "platform-lead"),
          ("oncall", "on-call"), ("viewer", "viewer")]


class Command(BaseCommand):
    help = "Create (or top up) the demo fleet and demo users. Idempotent."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--password", required=True, help="password for the demo users")
        parser.add_argument("--sim-base-port", type=int, default=8100)
        parser.add_argument("--gateway-admin", default="",
                            help="Envoy admin URL; with it, routes and a gateway are seeded")
        parser.add_argument("--gateway-config-dir", default="")

    def handle(self, *args: Any, **options: Any) -> None:
        actor = Actor.for_system("demo-seed")
        for code, name, jurisdiction in REGIONS:
            if not Region.objects.filter(code=code).exists():
                services.region_create(actor=actor, code=code, name=name,
                                       jurisdiction=jurisdiction)
        for name, runtime, version, accel, region, offset, rate, latency, labels in POOLS:
            pool = Pool.objects.filter(name=name).first()
            url = f"http://127.0.0.1:{options['sim_base_port'] + offset}"
            if pool is None:
                pool = services.pool_create(
                    actor=actor, name=name, runtime=runtime, runtime_version=version,
                    accelerator=accel, region=Region.objects.get(code=region), base_urls=[url],
                    latency_class=latency, max_context_tokens=32768, node_hourly_rate=rate,
                    currency="USD", labels=labels,
                )
            elif pool.base_urls != [url]:
                services.pool_update(actor=actor, pool=pool, base_urls=[url])
            if not PoolModel.objects.filter(pool=pool, model_id=MODEL).exists():
                services.pool_model_create(
                    actor=actor, pool=pool, model_id=MODEL, revision="0e9e39f",
                    quantisation="fp8" if runtime in ("cuda", "rocm") else "bf16",
                    weight_format="safetensors", max_context_tokens=32768,
                )
        self._people(actor, options["password"])
        self._trace(actor)
        if options["gateway_admin"]:
            self._traffic(actor, options["gateway_admin"], options["gateway_config_dir"])
            self._plans()
        self.stdout.write(f"demo fleet: {Pool.objects.count()} pools in "
                          f"{Region.objects.count()} regions")

    def _traffic(self, actor: Actor, admin_url: str, config_dir: str) -> None:
        """Two routes through one Envoy: the model, all on the H200 primary with the MI300X
        candidate ready at 0 %, and the same model pinned to the EU."""
        from fleetctl.traffic import services as traffic
        from fleetctl.traffic.models import Gateway, Route

        # The pools have not been probed yet when the demo starts; the seed forces (audited).
        routes = []
        for name, pin, primary in (("llama-8b", "", "h200-us-east"),
                                   ("llama-8b-eu", "EU", "tpu-v5e-eu-west")):
            route = Route.objects.filter(name=name).first() or traffic.route_create(
                actor=actor, name=name, model_id=MODEL, residency=pin,
                primary_pool=Pool.objects.get(name=primary), force=True,
                reason="demo seed (pools not probed yet)",
            )
            routes.append(route)
        gateway = Gateway.objects.filter(name="envoy-demo").first()
        options = {"config_dir": config_dir}
        if gateway is None:
            traffic.gateway_create(actor=actor, name="envoy-demo", kind="envoy",
                                   admin_address=admin_url, options=options, routes=routes)
        else:
            # A new Envoy starts empty: push it the whole state again.
            traffic.gateway_update(actor=actor, gateway=gateway, admin_address=admin_url,
                                   options=options, routes=routes)

    def _trace(self, actor: Actor) -> None:
        """A synthetic chat trace to benchmark the demo pools with (Benchmarks → New run)."""
        from fleetctl.bench import services as bench
        from fleetctl.bench.models import Trace

        if not Trace.objects.filter(name="demo-chat").exists():
            bench.trace_generate(
                actor=actor, name="demo-chat", n=2000, seed=1,
                description="Synthetic chat: lognormal lengths, 4 shared system prompts, "
                            "Poisson arrivals at 8/s.",
                prompt_tokens={"kind": "lognormal", "median": 400, "sigma": 0.6, "lo": 32,
                               "hi": 4000},
                completion_tokens={"kind": "lognormal", "median": 120, "sigma": 0.5, "lo": 8,
                                   "hi": 512},
                arrival={"kind": "poisson", "rate": 8.0}, shared_prefix_groups=4,
                shared_prefix_tokens=200)

    def _plans(self) -> None:
        """Two plans, both opened by `lead` so that `lead2` is the second platform lead:
        MI300X in stage 2 (shadow) with a partly green gate, and the A100 in stage 1 with a
        failing conformance result, which nobody can approve. Every step goes through the
        services, so each plan's timeline shows it."""
        from fleetctl.traffic.models import Route
        from migrations_plan import services as plans
        from migrations_plan.models import Plan

        lead = Actor(user=User.objects.get(username="lead"))
        lead2 = Actor(user=User.objects.get(username="lead2"))
        route = Route.objects.get(name="llama-8b")
        primary = Pool.objects.get(name="h200-us-east")
        terms: dict[str, Any] = {"primary_pool": primary, "routes": [route],
                                 "slo_ttft_p95_ms": 800, "slo_tpot_p95_ms": 60,
                                 "slo_error_rate": 0.01}
        if not Plan.objects.filter(name="mi300x-llama-8b").exists():
            plan = plans.plan_create(
                actor=lead, name="mi300x-llama-8b",
                candidate_pool=Pool.objects.get(name="mi300x-us-east"), **terms,
                notes="Move llama-8b interactive traffic from H200 to MI300X (demo).")
            plans.approve(actor=lead2, plan=plan, justification=(
                "Demo: the conformance probe and the benchmark that derives cost arrive with "
                "later issues; routing is in place and the pool is new."))
            plan = plans.advance(actor=lead2, plan=plan, reason="stage 1 signed off")
            plans.check_add(actor=lead, plan=plan, stage=2, title="", rule="pool.healthy_for",
                            params={"hours": 0.1})
            plans.check_add(actor=lead, plan=plan, stage=2, title="",
                            rule="routing.only_through_route")
        if not Plan.objects.filter(name="a100-llama-8b").exists():
            a100 = Pool.objects.get(name="a100-eu-central")
            plan = plans.plan_create(actor=lead, name="a100-llama-8b", candidate_pool=a100,
                                     **terms, notes="Previous-generation A100s for batch "
                                                    "traffic (demo).")
            plans.evidence_record(
                actor=Actor.for_system("demo-seed"), pool=a100, kind="conformance",
                verdict="fail", route=route,
                summary="(demo data) 3 of 40 contract cases fail: logprobs, tool_choice")

    def _people(self, actor: Actor, password: str) -> None:
        roles_ensure_groups()
        for username, role in PEOPLE:
            user = User.objects.filter(username=username).first()
            if user is None:
                user = User.objects.create_user(username=username, password=password)
                user_set_roles(actor=actor, username=username, role_names=[role])
            elif not user.check_password(password):
                user.set_password(password)
                user.save(update_fields=["password"])
            if username == "admin" and not user.is_staff:
                user.is_staff = True  # the Django admin is handy for people and roles
                user.save(update_fields=["is_staff"])
