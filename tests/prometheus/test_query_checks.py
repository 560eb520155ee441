"""Query checks against a real Prometheus: pass, fail, no data, errors, a Prometheus that is
down; as a plan's gate check, and as a ramp guard's extra metric."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from fleetctl.core.ports import free_port
from fleetctl.prometheus import evidence, services
from fleetctl.prometheus.models import MetricSource
from fleetctl.prometheus.query import QuerySpec
from fleetctl.ramps import guard
from fleetctl.ramps.guard import Judgement
from migrations_plan import services as plans
from migrations_plan.evidence import evaluate_gate
from migrations_plan.models import Evidence

pytestmark = pytest.mark.django_db


def source(world, url: str, name: str = "prom") -> MetricSource:
    return services.source_create(actor=world.actor("admin"), name=name, base_url=url,
                                  timeout_s=2.0)


def measure(query: str, success: str = "", failure: str = "", pool: str = "mi300x-us"):
    return services.query_measure(QuerySpec("prom", query, success, failure), pool=pool)


def test_pass_fail_and_values_are_stored_queried_from_the_source(stack, world):
    source(world, stack.prometheus.url)
    passed = measure('up{pool="$pool"}', success="result == 1")
    assert passed.status == "pass", passed.reason
    assert passed.query == 'up{pool="mi300x-us"}'
    assert passed.values[0]["value"] == 1.0 and passed.values[0]["labels"]["pool"] == "mi300x-us"
    assert "(queried from prom)" in passed.reason
    failed = measure('up{pool="$pool"}', success="result == 0")
    assert failed.status == "fail" and "does not hold" in failed.reason
    by_failure = measure("sum(vllm:num_requests_waiting)", failure="result >= 0")
    assert by_failure.status == "fail" and "failure condition" in by_failure.reason
    inconclusive = measure('up{pool="$pool"}', success="result > 5", failure="result < 0")
    assert inconclusive.status == "warn"


def test_envoy_admin_stats_are_scraped_and_queried(stack, world):
    source(world, stack.prometheus.url)
    live = measure('envoy_server_live{gateway="envoy-test"}', success="result == 1")
    assert live.status == "pass", live.reason


def test_no_series_nan_errors_and_down_are_insufficient_never_pass(stack, world):
    source(world, stack.prometheus.url)
    none = measure('up{pool="no-such-pool"}', success="result == 1")
    assert none.status == "insufficient" and "no series" in none.reason
    # A ratio over nothing: 0/0 is NaN, not a pass.
    nan = measure("sum(vllm:num_requests_waiting) / 0 * 0", success="result < 1")
    assert nan.status == "insufficient" and "NaN" in nan.reason
    bad = measure("up{", success="result == 1")
    assert bad.status == "insufficient" and "HTTP 400" in bad.reason, bad.reason
    ranged = measure("up[1m]", success="result == 1")
    assert ranged.status == "insufficient" and "matrix" in ranged.reason
    services.source_create(actor=world.actor("admin"), name="down",
                           base_url=f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    down = services.query_measure(QuerySpec("down", "up", "result == 1"))
    assert down.status == "insufficient" and "unreachable" in down.reason, down.reason


def test_gate_check_reads_count_measurements(stack, world):
    source(world, stack.prometheus.url)
    plan = world.plan()
    check = plans.check_add(actor=world.actor("author"), plan=plan, stage=1,
                            rule=evidence.QUERY_RULE, title="",
                            params={"source": "prom", "query": 'up{pool="$pool"}',
                                    "success": "result == 1", "count": 2, "interval_s": 5})
    outcome = next(o for o in evaluate_gate(plan).outcomes if o.check.pk == check.pk)
    assert outcome.result.status == "insufficient"
    assert services.gate_queries_measure() == 1
    assert services.gate_queries_measure() == 0  # not due again within its interval
    outcome = next(o for o in evaluate_gate(plan).outcomes if o.check.pk == check.pk)
    assert outcome.result.status == "insufficient" and "1 of 2" in outcome.result.summary
    row = Evidence.objects.get(kind=evidence.QUERY_KIND)
    assert row.source == "queried from prom"
    assert row.data["query"] == 'up{pool="mi300x-us"}'
    assert row.data["measurement"]["values"][0]["value"] == 1.0
    services.query_check_record(plan, check.params)
    outcome = next(o for o in evaluate_gate(plan).outcomes if o.check.pk == check.pk)
    assert outcome.result.status == "pass", outcome.result.summary
    assert "queried from prom" in outcome.result.summary
    # One failing measurement fails the check.
    plans.check_update(actor=world.actor("author"), check=check,
                       params={**check.params, "success": "result == 0"})
    check.refresh_from_db()
    services.query_check_record(plan, check.params)
    outcome = next(o for o in evaluate_gate(plan).outcomes if o.check.pk == check.pk)
    assert outcome.result.status == "fail"


def test_bad_check_parameters_are_refused_and_nothing_changes(world):
    plan = world.plan()
    before = plan.checks.count()
    with pytest.raises(ValidationError, match=r"no metric source named 'prom' \(none is"):
        plans.check_add(actor=world.actor("author"), plan=plan, stage=1,
                        rule=evidence.QUERY_RULE, title="",
                        params={"source": "prom", "query": "up", "success": "result < 1"})
    source(world, "http://127.0.0.1:9")
    with pytest.raises(ValidationError, match="is not 'result <op> <number>'"):
        plans.check_add(actor=world.actor("author"), plan=plan, stage=1,
                        rule=evidence.QUERY_RULE, title="",
                        params={"source": "prom", "query": "up", "success": "import os"})
    assert plan.checks.count() == before


def _base(decision: str) -> Judgement:
    return Judgement(decision, [f"own figures: {decision}"], {"candidate": {}})


def test_ramp_guard_metric_pass_fail_and_down(stack, world):
    source(world, stack.prometheus.url)
    services.source_create(actor=world.actor("admin"), name="gone",
                           base_url=f"http://127.0.0.1:{free_port()}", timeout_s=1.0)
    ok = {"source": "prom", "query": 'up{pool="$pool"}', "success": "result == 1",
          "name": "scraped"}
    bad = {"source": "prom", "query": 'max(vllm:gpu_cache_usage_perc{pool="$pool"})',
           "failure": "result >= 0", "name": "kv cache"}
    down = {"source": "gone", "query": "up", "success": "result == 1"}

    def judged(base: str, *specs: dict[str, str]) -> Judgement:
        measured = services.ramp_metrics_measure(list(specs), pool="mi300x-us", route="llama",
                                                 model="m")
        return guard.with_metrics(_base(base), [m.as_dict() for m in measured])

    passed = judged(guard.PASS, ok)
    assert passed.decision == guard.PASS
    assert passed.numbers["metrics"][0]["values"][0]["value"] == 1.0
    failed = judged(guard.PASS, ok, bad)
    assert failed.decision == guard.FAIL and "kv cache" in failed.reasons[0]
    # Counted toward the rollback like the guard's own failing figures.
    assert guard.failures_after(1, failed.decision) == 2
    waited = judged(guard.PASS, ok, down)
    assert waited.decision == guard.WAIT and "unreachable" in waited.reasons[0]
    assert guard.failures_after(1, waited.decision) == 1  # never advances, never rolls back
    assert judged(guard.FAIL, down).decision == guard.FAIL  # its own failure still counts
    assert judged(guard.WARN, ok).decision == guard.WARN


def test_ramp_refuses_bad_metric_checks_via_api(world, client_for):
    from fleetctl.ramps.models import Ramp

    source(world, "http://127.0.0.1:9", name="prom")
    client = client_for("lead-api", "platform-lead")
    body = {"route": "llama", "pool": "mi300x-us", "steps": [{"percent": 5, "hold_s": 60}],
            "slo_ttft_p95_ms": 800, "slo_tpot_p95_ms": 60, "slo_error_rate": 0.01,
            "latency_margin_pct": 10,
            "metric_checks": [{"source": "nope", "query": "up", "success": "result = 1"}]}
    answer = client.post("/api/v1/ramps/", body, format="json")
    assert answer.status_code == 400, answer.content
    text = answer.content.decode()
    assert "no metric source named 'nope'" in text and "result = 1" in text
    assert not Ramp.objects.exists()


def test_source_urls_follow_the_outbound_rules_per_purpose(world, settings, client_for):
    """A loopback Prometheus is allowed only because OUTBOUND_ALLOW_METRICS lists loopback
    (the test stack's setting, as the demo's); that opens nothing for webhooks, and fleetctl's
    own services (Redis here) are refused whatever is allowed. Only administrators add one."""
    from fleetctl.core.destinations import METRICS, WEBHOOKS, url_problem

    admin = client_for("root", "admin")
    refused = admin.post("/api/v1/metric-sources/", {
        "name": "redis", "base_url": settings.REDIS_URL.replace("redis://", "http://")},
        format="json")
    assert refused.status_code == 400 and "own services" in refused.content.decode()
    # Webhooks not allow-listed (production's default), metric sources on loopback: each
    # purpose reads its own list.
    allowed = settings.OUTBOUND_ALLOWED_NETWORKS
    settings.OUTBOUND_ALLOWED_NETWORKS = {**allowed, "webhooks": []}
    assert "loopback" in (url_problem("http://127.0.0.1:9090", purpose=WEBHOOKS) or "")
    assert url_problem("http://127.0.0.1:9090", purpose=METRICS) is None
    settings.OUTBOUND_ALLOWED_NETWORKS = {**allowed, "metrics": []}
    refused = admin.post("/api/v1/metric-sources/", {
        "name": "local", "base_url": "http://127.0.0.1:9090"}, format="json")
    assert refused.status_code == 400 and "OUTBOUND_ALLOW_METRICS" in refused.content.decode()
    meta = admin.post("/api/v1/metric-sources/", {
        "name": "meta", "base_url": "http://169.254.169.254/"}, format="json")
    assert meta.status_code == 400 and "metadata" in meta.content.decode()
    lead = client_for("lead-src", "platform-lead")
    assert lead.post("/api/v1/metric-sources/", {
        "name": "ext", "base_url": "http://10.0.0.5:9090"}, format="json").status_code == 403
    assert not MetricSource.objects.exists()
    made = admin.post("/api/v1/metric-sources/", {
        "name": "ext", "base_url": "http://10.0.0.5:9090", "bearer_token": "s3cret"},
        format="json")
    assert made.status_code == 201, made.content
    assert "s3cret" not in made.content.decode() and made.json()["has_bearer_token"] is True
    assert "s3cret" not in lead.get("/api/v1/metric-sources/").content.decode()
