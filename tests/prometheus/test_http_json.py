"""The http-json metric source kind against a real HTTP server (tests/prometheus/
json_endpoint.py), reached through the outbound client like a Prometheus: pass, fail, no data
(never a pass), an answer that is not JSON or not a number, an error status, no answer in
time, a gate check measured from it; and loopback refused again once the allow-list is gone."""

from __future__ import annotations

import pytest

from fleetctl.prometheus import evidence, services
from fleetctl.prometheus.models import MetricSource
from fleetctl.prometheus.query import QuerySpec
from migrations_plan import services as plans
from migrations_plan.evidence import evaluate_gate
from migrations_plan.models import Evidence

pytestmark = pytest.mark.django_db


def _source(world, url: str, timeout_s: float = 5.0) -> MetricSource:
    return services.source_create(actor=world.actor("admin"), name="stats", kind="http-json",
                                  base_url=url, bearer_token="tok-1", timeout_s=timeout_s)


def _measure(query: str, field: str, success: str = "", failure: str = ""):
    return services.query_measure(QuerySpec("stats", query, success, failure, field=field),
                                  pool="mi300x-us")


def test_pass_and_fail_read_the_field_with_the_pool_filled_in(world, json_endpoint):
    _source(world, json_endpoint.url)
    json_endpoint.json("/pools/mi300x-us/slo", {"data": {"error_rate": 0.01,
                                                         "ttft": [120, 480]}})
    passed = _measure("/pools/$pool/slo", "data.error_rate", success="result < 0.05")
    assert passed.status == "pass", passed.reason
    assert passed.values == [{"labels": {}, "value": 0.01}]
    assert passed.query == "/pools/mi300x-us/slo" and "(queried from stats)" in passed.reason
    path, headers = json_endpoint.asked[-1]
    assert path == "/pools/mi300x-us/slo" and headers["Authorization"] == "Bearer tok-1"
    failed = _measure("pools/$pool/slo", "data.error_rate", success="result < 0.005")
    assert failed.status == "fail" and "does not hold" in failed.reason, failed.reason
    # A list: every value judged; one over the failure condition fails the check.
    listed = _measure("/pools/$pool/slo", "data.ttft", failure="result > 400")
    assert listed.status == "fail" and "480" in listed.reason, listed.reason
    assert [v["value"] for v in listed.values] == [120.0, 480.0]
    first = _measure("/pools/$pool/slo", "data.ttft.0", success="result < 400")
    assert first.status == "pass", first.reason
    # The source remembers its newest outcome (shown on its page).
    source = MetricSource.objects.get(name="stats")
    assert source.last_status == "pass" and source.last_at is not None


def test_no_data_is_insufficient_never_a_pass(world, json_endpoint):
    _source(world, json_endpoint.url)
    json_endpoint.json("/m", {"data": {"error_rate": None, "empty": []}})
    for field in ("data.missing", "data.error_rate", "data.empty", "data.error_rate.0",
                  "nothing.at.all"):
        for condition in ({"success": "result < 1"}, {"failure": "result > 1"}):
            got = _measure("/m", field, **condition)
            assert got.status == "insufficient", (field, condition, got.reason)
            assert "no series" in got.reason and "never a pass" in got.reason


def test_answers_that_are_not_json_or_not_numbers_or_errors(world, json_endpoint):
    _source(world, json_endpoint.url)
    json_endpoint.text("/html", "<html><body>login</body></html>")
    html = _measure("/html", "value", success="result < 1")
    assert html.status == "insufficient" and "the answer is not JSON" in html.reason
    json_endpoint.json("/word", {"value": "fast"})
    word = _measure("/word", "value", success="result < 1")
    assert word.status == "insufficient" and "'fast' is not a number" in word.reason
    json_endpoint.json("/object", {"value": {"p95": 1}})
    nested = _measure("/object", "value", success="result < 1")
    assert nested.status == "insufficient" and "not a number or a list" in nested.reason
    json_endpoint.json("/flag", {"value": True})
    flag = _measure("/flag", "value", success="result < 2")
    assert flag.status == "insufficient", "a boolean is not a measurement"
    json_endpoint.json("/broken", {"error": "backend exploded"}, status=500)
    broken = _measure("/broken", "value", success="result < 1")
    assert broken.status == "insufficient"
    assert "HTTP 500: backend exploded" in broken.reason, broken.reason
    missing = _measure("/nowhere", "value", success="result < 1")
    assert missing.status == "insufficient" and "HTTP 404" in missing.reason


def test_no_answer_in_time_is_insufficient(world, json_endpoint):
    _source(world, json_endpoint.url, timeout_s=0.3)
    json_endpoint.hang("/slow")
    slow = _measure("/slow", "value", success="result < 1")
    assert slow.status == "insufficient" and "no answer within 0.3 s" in slow.reason, \
        slow.reason


def test_a_gate_check_is_measured_from_an_http_json_source(world, json_endpoint):
    _source(world, json_endpoint.url)
    json_endpoint.json("/slo/mi300x-us", {"error_rate": 0.002})
    plan = world.plan()
    check = plans.check_add(actor=world.actor("author"), plan=plan, stage=1,
                            rule=evidence.QUERY_RULE, title="",
                            params={"source": "stats", "query": "/slo/$pool",
                                    "field": "error_rate", "success": "result < 0.01",
                                    "count": 1, "interval_s": 5})
    assert services.gate_queries_measure() == 1
    row = Evidence.objects.get(kind=evidence.QUERY_KIND)
    assert row.verdict == "pass" and row.data["query"] == "/slo/mi300x-us"
    outcome = next(o for o in evaluate_gate(plan).outcomes if o.check.pk == check.pk)
    assert outcome.result.status == "pass", outcome.result.summary


def test_loopback_is_reached_only_while_the_allow_list_says_so(world, json_endpoint,
                                                              settings):
    """The test stack allows loopback for purpose `metrics` (as the demo does); without it
    the same source is refused before every query, and nothing is asked."""
    _source(world, json_endpoint.url)
    json_endpoint.json("/v", {"value": 1})
    assert _measure("/v", "value", success="result == 1").status == "pass"
    asked = len(json_endpoint.asked)
    settings.OUTBOUND_ALLOWED_NETWORKS = {**settings.OUTBOUND_ALLOWED_NETWORKS, "metrics": []}
    refused = _measure("/v", "value", success="result == 1")
    assert refused.status == "insufficient" and "refused" in refused.reason
    assert "loopback" in refused.reason, refused.reason
    assert len(json_endpoint.asked) == asked
