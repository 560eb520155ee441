"""The demo fleet with something on every page, for the page walk (tests/web/test_page_walk.py).

`make demo`'s seed (`demo_seed`) is run with the demo's own options; what the demo's workers,
gateway, collector and prober would add over its first minutes is then written the way they
write it (rows through the services where a service writes them, directly where a worker
does), without starting any of them:

- probe history on every pool (so every pool is healthy, with a chart);
- a plan at each stage: a new H100 pool in stage 1 and the Gaudi pool walked to stage 4 by the two
  leads, beside the seed's MI300X (stage 2) and A100 (stage 3) plans;
- the seed's guarded ramp of the Gaudi pool (which waits for the pool to be healthy), and
  live telemetry windows for the pools on llama-8b;
- a drain of the A100 and its restore;
- two webhooks, the plan moves' deliveries, some delivered and some failing;
- two metric sources (a Prometheus read by a gate check, an HTTP JSON endpoint), each with
  the last outcome the query producer would have recorded;
- pairs and judgements in the seed's shadow run, a finished eval run, a finished benchmark,
  a batch job with results, API tokens.

Runs in any process configured for the database to fill: the walk's PostgreSQL test
database (`seed_demo`), or a fresh SQLite demo through `python -m tests.support.demo_site`.
"""

from __future__ import annotations

import io
import json
from datetime import timedelta
from pathlib import Path
from typing import Any

from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from fleetctl.accounts.actor import Actor

ROLES = {"admin": "admin", "lead": "platform-lead", "lead2": "platform-lead",
         "oncall": "on-call", "viewer": "viewer"}
GATEWAY_ADMIN = "http://127.0.0.1:1"  # nothing listens: pushes fail and stay visible, fast
SIM_BASE_PORT = 8100


def person(username: str) -> Actor:
    return Actor(user=User.objects.get(username=username))


def seed_demo(*, password: str, data_dir: Path) -> str:
    """Everything: the demo's seed, then what the walk adds. Returns what the seed said of
    objects it skipped (a refusal by the services), for a failure's message."""
    args = ["demo_seed", f"--password={password}", "--sim-base-port", str(SIM_BASE_PORT),
            "--gateway-admin", GATEWAY_ADMIN, "--gateway-config-dir", str(data_dir / "envoy"),
            "--conformance", "--evals"]
    notes = io.StringIO()
    call_command(*args, stdout=io.StringIO(), stderr=notes)
    probe_history()
    webhooks()
    plans()
    metric_sources()
    ramp()
    telemetry()
    drains()
    shadow_pairs()
    eval_run()
    benchmark()
    batch_job(data_dir)
    tokens()
    return notes.getvalue()


def probe_history() -> None:
    from fleetctl.fleet.models import Pool
    from tests.web.factories import seed_probe_history

    for pool in Pool.objects.all():
        seed_probe_history(pool, hours=2)


def webhooks() -> None:
    from fleetctl.webhooks import services

    admin = person("admin")
    services.webhook_create(actor=admin, name="ops-alerts",
                            url="https://hooks.example.com/fleetctl/ops")
    services.webhook_create(actor=admin, name="ramps-slack", format="slack",
                            url="https://hooks.example.com/services/T000/B000/XXXX",
                            events=["ramp.decision", "gate.changed"])


def metric_sources() -> None:
    """A Prometheus that a plan's stage gate reads (its last query failed: nothing listens at
    a private address in a test), and an HTTP JSON source whose last query passed."""
    from fleetctl.prometheus import evidence, services
    from fleetctl.prometheus.query import Measurement
    from migrations_plan import services as plans
    from migrations_plan.models import Plan

    admin = person("admin")
    prom = services.source_create(actor=admin, name="cluster-prometheus",
                                  base_url="http://10.20.0.5:9090", timeout_s=2)
    stats = services.source_create(actor=admin, name="serving-stats", kind="http-json",
                                   base_url="http://10.20.0.6:8080/api", bearer_token="t0k")
    services.remember(prom, Measurement(
        "insufficient", "queue depth: the source is unreachable (connect timeout) (queried "
                        "from cluster-prometheus)", "cluster-prometheus", "sum(queue)"))
    services.remember(stats, Measurement(
        "pass", "/slo/gaudi3-in-west = 0.002: 'result < 0.01' holds (queried from "
                "serving-stats)", "serving-stats", "/slo/gaudi3-in-west"))
    # A later stage's gate of an open plan: its current gate (and the ramp) stay as they were.
    plan = (Plan.objects.exclude(state__in=Plan.CLOSED_STATES).filter(stage__lt=4)
            .order_by("name").first())
    if plan is not None:
        plans.check_add(actor=person("lead"), plan=plan, stage=4, title="",
                        rule=evidence.QUERY_RULE,
                        params={"source": "cluster-prometheus",
                                "query": 'sum(queue{pool="$pool"})', "failure": "result > 100"})


def plans() -> None:
    """The TPU opens in stage 1; the Gaudi pool is walked to stage 4 by `lead2` (attesting
    what a person must, approving with a justification where evidence is missing). Each
    move notifies the webhooks."""
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic.models import Route
    from migrations_plan import services
    from migrations_plan.models import GateCheck

    terms: dict[str, Any] = {
        "primary_pool": Pool.objects.get(name="h200-us-east"),
        "routes": [Route.objects.get(name="llama-8b")],
        "slo_ttft_p95_ms": 800, "slo_tpot_p95_ms": 60, "slo_error_rate": 0.01}
    lead, lead2 = person("lead"), person("lead2")
    services.plan_create(actor=lead, name="h100-llama-8b", candidate_pool=_new_pool(), **terms,
                         notes="An H100 pool for llama-8b: the conformance probe comes first.")
    plan = services.plan_create(actor=lead, name="gaudi3-llama-8b",
                                candidate_pool=Pool.objects.get(name="gaudi3-in-west"),
                                **terms, notes="Gaudi 3 takes live llama-8b traffic (walk).")
    attester = {"platform-lead": lead, "on-call": person("oncall"), "admin": person("admin")}
    while plan.stage < 4:
        for check in plan.checks.filter(stage=plan.stage, removed_at__isnull=True,
                                        kind=GateCheck.Kind.ATTESTED):
            services.attest(actor=attester.get(check.attest_role, person("admin")),
                            check=check, note=f"confirmed for stage {plan.stage} (walk)")
        services.approve(actor=lead2, plan=plan,
                         justification="the walk's plan: signed off without the evidence")
        plan = services.advance(actor=lead2, plan=plan, reason=f"leaving stage {plan.stage}")


def ramp() -> None:
    """The seed's guarded ramp of the Gaudi pool on llama-8b, which it leaves for later when
    the pool is not healthy yet (as here, before the prober ran): now it is."""
    from fleetctl.demo.management.commands import demo_seed
    from fleetctl.fleet.models import Pool
    from fleetctl.ramps import services
    from fleetctl.traffic.models import Route

    services.ramp_create(actor=person("lead"), route=Route.objects.get(name=demo_seed.RAMP_ROUTE),
                         pool=Pool.objects.get(name=demo_seed.RAMP_POOL),
                         reason="demo: Gaudi 3 takes a share of llama-8b (walk)", **demo_seed.RAMP)


def _new_pool() -> Any:
    """A sixth pool, in the UK (the demo's pools all carry a route but the Gaudi one; a
    plan's candidate starts with no live weight)."""
    from fleetctl.fleet import services
    from fleetctl.fleet.models import Region

    admin = person("admin")
    pool = services.pool_create(
        actor=admin, name="h100-uk-south", runtime="cuda", runtime_version="vllm-0.11",
        accelerator="H100", region=Region.objects.get(code="uk-south"),
        base_urls=[f"http://127.0.0.1:{SIM_BASE_PORT + 7}"], latency_class="interactive",
        max_context_tokens=32768, node_hourly_rate="24.10", currency="USD")
    services.pool_model_create(actor=admin, pool=pool, model_id="llama-3.1-8b-instruct",
                               revision="0e9e39f", quantisation="fp8",
                               max_context_tokens=32768)
    return pool


def telemetry() -> None:
    """Ten-second windows over the last ten minutes, as the ingester writes them: the
    gateway's view of the H200 and the Gaudi pool on llama-8b, and each pool's /metrics."""
    from fleetctl.telemetry import histogram
    from fleetctl.telemetry.models import Window

    now = timezone.now().replace(microsecond=0)
    now -= timedelta(seconds=now.second % 10)
    rows = []
    for pool, ttft_ms, tpot_ms, share in (("h200-us-east", 140.0, 12.0, 0.95),
                                          ("gaudi3-in-west", 190.0, 16.0, 0.05)):
        for step in range(1, 61):
            start = now - timedelta(seconds=10 * step)
            requests = max(1, int(40 * share))
            ttft: dict[str, int] = {}
            tpot: dict[str, int] = {}
            histogram.add(ttft, ttft_ms + step % 7, requests)
            histogram.add(tpot, tpot_ms + step % 3, requests)
            rows.append(Window(source="gateway", source_name="envoy-demo", route="llama-8b",
                               pool=pool, resolution_s=10, start=start, requests=requests,
                               errors=int(step % 17 == 0), streamed=requests, ttft=ttft,
                               updated_at=now))
            rows.append(Window(source="pool", source_name=pool, route="", pool=pool,
                               resolution_s=10, start=start, ttft=ttft, tpot=tpot,
                               updated_at=now))
    Window.objects.bulk_create(rows)


def drains() -> None:
    """The A100's share of the batch route drained by `oncall`, then restored: two records
    whose pushes to the (absent) gateway stay open."""
    from fleetctl.fleet.models import Pool
    from fleetctl.traffic import services

    oncall = person("oncall")
    drain = services.drain_request(actor=oncall, pool=Pool.objects.get(name="a100-eu-central"),
                                   reason="walk: the A100s answer slowly")
    services.drain_restore(actor=oncall, drain=drain, reason="walk: the A100s recovered")


def shadow_pairs() -> None:
    """Pairs and judgements in the seed's mirror run, as its workers and judge write them."""
    from fleetctl.shadow.models import ShadowJudgement, ShadowPair, ShadowRun

    run = ShadowRun.objects.filter(plan__name="mi300x-llama-8b").first()
    if run is None:
        return
    now = timezone.now()
    # The seed's run keeps no content ("redacted"): metrics and hashes only.
    for i, score in enumerate((0.0, 0.4, 1.0)):
        ShadowPair.objects.create(
            run=run, source="mirror", received_at=now - timedelta(seconds=30 - i),
            request_hash=f"{i:064d}", greedy=True,
            params={"model": "llama-3.1-8b-instruct", "temperature": 0},
            sides={side: {"endpoint": f"http://127.0.0.1:810{n + 1}", "status": 200,
                          "finish": "stop", "completion_tokens": 7, "ttft_ms": 12.0 + n,
                          "text_sha256": "ab" * 32}
                   for n, side in enumerate(("primary", "secondary", "candidate"))},
            content={}, noise={"diverged": 0}, signal={"diverged": int(score > 0)},
            noise_diverged=False, signal_diverged=score > 0, divergence_score=score)
    for i, (signal, lower, upper, verdict) in enumerate([(0.02, -0.02, 0.05, "insufficient"),
                                                         (0.035, 0.009, 0.07, "warn")]):
        n = 200 * (i + 1)
        divergence = {"n": n, "noise_rate": 0.01, "signal_rate": signal,
                      "estimate": signal - 0.01, "lower": lower, "upper": upper,
                      "p_value": 0.2, "method": "newcombe", "verdict": verdict, "gated": True}
        ShadowJudgement.objects.create(run=run, at=now - timedelta(seconds=60 * (2 - i)),
                                       pairs=n, verdict=verdict,
                                       metrics={"divergence": divergence})
    ShadowRun.objects.filter(pk=run.pk).update(
        verdict="warn", summary="divergence +2.5 points [+0.9, +7.0] over 400 pairs",
        counters={"received": 480, "sampled": 420, "pairs": 3})


# One item asks in words beyond ASCII, which SQLite stores escaped in the JSON of its
# messages: the run page's item search must find it on both databases.
SEARCH_BEYOND_ASCII = ("Straße", "item-006")


def question(i: int) -> str:
    word, item = SEARCH_BEYOND_ASCII
    return f"What is {i}+1? Asked on the {word}." if f"item-{i:03d}" == item else f"What is {i}+1?"


def eval_run() -> None:
    """A small suite run on the Gaudi plan's candidate against the H200, every answer written
    as the runner writes it, finished by the service (statistics, evidence)."""
    from fleetctl.evals import services
    from fleetctl.evals.models import EvalResult, EvalRun
    from fleetctl.fleet.models import Pool
    from migrations_plan.models import Plan

    header = {"fleetctl_eval_suite": 1, "description": "the walk's arithmetic",
              "decoding": {"temperature": 0, "seed": 1, "max_tokens": 32}}
    lines = [json.dumps(header)] + [json.dumps({
        "id": f"item-{i:03d}", "messages": [{"role": "user", "content": question(i)}],
        "references": [str(i + 1)], "scorer": "numeric", "tags": ["arithmetic", f"n:{i % 3}"]})
        for i in range(40)]
    suite, _ = services.suite_upload(actor=person("lead"), name="walk-arithmetic",
                                     fileobj=io.BytesIO("\n".join(lines).encode()))
    plan = Plan.objects.get(name="gaudi3-llama-8b")
    run = services.run_create(actor=person("lead"), suite=suite, candidate=plan.candidate_pool,
                              primary=Pool.objects.get(name="h200-us-east"), plan=plan,
                              min_items=20)
    EvalRun.objects.filter(pk=run.pk).update(status=EvalRun.Status.RUNNING,
                                             started_at=timezone.now())
    now = timezone.now()
    for result in EvalResult.objects.filter(run=run).select_related("run_pool", "item"):
        index = result.item.position
        wrong = index % (5 if result.run_pool.role == "candidate" else 13) == 1
        result.status = EvalResult.Status.DONE
        result.text = f"The answer is {index + (7 if wrong else 1)}."
        result.score = 0.0 if wrong else 1.0
        result.reason = "differs" if wrong else "matches"
        result.http_status = 200
        result.scored_at = now
        result.save()
    EvalRun.objects.filter(pk=run.pk).update(done=run.total)
    services.run_finish(EvalRun.objects.get(pk=run.pk))


def benchmark() -> None:
    from fleetctl.bench.models import Trace
    from fleetctl.fleet.models import Pool
    from tests.bench.helpers import finished_run

    finished_run(Trace.objects.get(name="demo-chat"), Pool.objects.get(name="h200-us-east"),
                 Pool.objects.get(name="mi300x-us-east"))


def batch_job(data_dir: Path) -> None:
    """A 12-request job on the H200, eight answered (one failing), still running."""
    from fleetctl.batch import services
    from fleetctl.batch.models import BatchChunk, BatchJob, BatchResult
    from fleetctl.fleet.models import Pool
    from tests.batch.factory import upload, write_input

    oncall = person("oncall")
    path = write_input(data_dir / "walk-input.jsonl", 12)
    job = services.job_create(actor=oncall, input_file=upload(oncall, path),
                              pool=Pool.objects.get(name="h200-us-east"), chunk_size=5)
    started = timezone.now() - timedelta(seconds=60)
    BatchJob.objects.filter(pk=job.pk).update(state="running", started_at=started)
    for index in range(8):
        ok = index != 3
        chunk = BatchChunk.objects.get(job=job, first_index__lte=index, last_index__gte=index)
        body = ('{"id": "x", "object": "chat.completion", "choices": [{"index": 0, "message": '
                '{"role": "assistant", "content": "answer"}, "finish_reason": "stop"}], '
                '"usage": {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}}'
                if ok else '{"error": {"message": "overloaded"}}')
        with transaction.atomic():
            BatchResult.objects.create(
                job=job, index=index, custom_id=f"req-{index}", status_code=200 if ok else 503,
                body=body, error_code="" if ok else "retries_exhausted",
                error_message="" if ok else "overloaded", prompt_tokens=7,
                output_tokens=5 if ok else 0, worker="batch-1",
                finished_at=started + timedelta(seconds=5 * index))
            BatchChunk.objects.filter(pk=chunk.pk).update(
                succeeded=F("succeeded") + int(ok), failed=F("failed") + int(not ok),
                prompt_tokens=F("prompt_tokens") + 7, output_tokens=F("output_tokens") + 5 * ok)


def tokens() -> None:
    from fleetctl.accounts.services import token_create_personal, token_create_service

    token_create_personal(actor=person("oncall"), name="laptop", scopes=["read", "drain"])
    token_create_service(actor=person("admin"), name="ramp-bot", scopes=["read", "ramp"])
