"""Generated alerting rules and dashboards: downloads, loaded into a real Prometheus and found
by the rules check; missing rules are named; stage 2's dashboards check becomes measured."""

from __future__ import annotations

import json

import pytest
import yaml

from fleetctl.prometheus import evidence, generate, selectors, services
from migrations_plan.evidence import evaluate_gate
from tests.support.waiting import wait_until

pytestmark = pytest.mark.django_db


def load(stack, name: str, text: str) -> None:
    path = stack.rules_dir / f"{name}.rules.yml"
    path.write_text(text)
    stack.prometheus.rule_files = sorted(stack.rules_dir.glob("*.yml"))
    stack.prometheus.reload()


def groups_loaded(stack) -> set[str]:
    from fleetctl.core.http import http_get

    body = http_get(f"{stack.prometheus.url}/api/v1/rules", timeout_s=5).json()
    return {g["name"] for g in body["data"]["groups"]}


def test_downloads_per_pool_and_plan(world, client_for):
    plan = world.plan()
    client = client_for("reader", "viewer")
    answer = client.get("/api/v1/pools/mi300x-us/alert-rules/")
    assert answer.status_code == 200 and answer["Content-Type"] == "application/yaml"
    rules = yaml.safe_load(answer.content)["groups"][0]
    assert rules["name"] == "fleetctl-pool-mi300x-us"
    assert [r["alert"] for r in rules["rules"]] == list(generate.ALERT_NAMES)
    ttft = next(r for r in rules["rules"] if r["alert"] == "FleetctlTTFTP95High")
    assert ttft["expr"].endswith("> 800")  # the plan's SLO
    assert ttft["labels"]["device_class"] == "H200" or ttft["labels"]["runtime"] == "rocm"
    assert "plan mi300x-llama" in ttft["annotations"]["slo"]
    answer = client.get(f"/api/v1/plans/{plan.name}/alert-rules/")
    assert [g["name"] for g in yaml.safe_load(answer.content)["groups"]] == [
        "fleetctl-pool-mi300x-us", "fleetctl-pool-h200-us"]
    board = client.get("/api/v1/pools/mi300x-us/dashboard/").json()
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    assert any("vllm:num_requests_waiting" in e for e in exprs)
    assert any("vllm:gpu_cache_usage_perc" in e for e in exprs)
    board = client.get(f"/api/v1/plans/{plan.name}/dashboard/").json()
    assert len([p for p in board["panels"] if p["type"] == "row"]) == 2
    json.dumps(board)
    assert client.get("/api/v1/pools/nope/dashboard/").status_code == 404
    assert client.get("/api/v1/plans/nope/alert-rules/").status_code == 404


def test_generated_rules_are_valid_loaded_and_found(stack, world):
    world.plan()
    prom = services.source_create(actor=world.actor("admin"), name="prom",
                                  base_url=stack.prometheus.url)
    load(stack, "candidate", selectors.pool_rules_yaml(world.candidate))
    wait_until(lambda: "fleetctl-pool-mi300x-us" in groups_loaded(stack),
               what="the generated group to load", explain=stack.prometheus.log)
    status, summary, _, missing = services.alerts_loaded_in(prom, "mi300x-us")
    assert (status, missing) == ("pass", []), summary
    assert summary.startswith("measured: 6 rules loaded in prom")
    # The primary's group is not loaded: every rule is named missing.
    status, summary, _, missing = services.alerts_loaded_in(prom, "h200-us")
    assert status == "fail" and missing == list(generate.ALERT_NAMES)
    assert "FleetctlKVCacheFull" in summary and "is not loaded" in summary
    # Part of a group loaded: the rules it lacks are named.
    partial = yaml.safe_load(selectors.pool_rules_yaml(world.primary))
    partial["groups"][0]["rules"] = partial["groups"][0]["rules"][:4]
    load(stack, "primary", yaml.safe_dump(partial))
    wait_until(lambda: "fleetctl-pool-h200-us" in groups_loaded(stack),
               what="the partial group to load", explain=stack.prometheus.log)
    status, summary, _, missing = services.alerts_loaded_in(prom, "h200-us")
    assert status == "fail" and missing == ["FleetctlQueueDepthHigh", "FleetctlKVCacheFull"]
    assert "measured: 4 of 6 rules loaded" in summary


def test_dashboards_check_turns_measured(stack, world, client_for):
    plan = world.plan()
    services.source_create(actor=world.actor("admin"), name="prom",
                           base_url=stack.prometheus.url)
    load(stack, "candidate", selectors.pool_rules_yaml(world.candidate))
    wait_until(lambda: "fleetctl-pool-mi300x-us" in groups_loaded(stack),
               what="the generated group to load", explain=stack.prometheus.log)
    client = client_for("lead-m", "platform-lead")
    answer = client.post(f"/api/v1/plans/{plan.name}/dashboards-measured/",
                         {"source": "nope"}, format="json")
    assert answer.status_code == 400
    assert plan.checks.get(stage=2, key="dashboards", removed_at__isnull=True).kind == \
        "attested"
    answer = client.post(f"/api/v1/plans/{plan.name}/dashboards-measured/",
                         {"source": "prom"}, format="json")
    assert answer.status_code == 200, answer.content
    check = plan.checks.get(stage=2, key="dashboards", removed_at__isnull=True)
    assert (check.kind, check.rule) == ("evidence", evidence.ALERTS_RULE)
    outcome = next(o for o in evaluate_gate(plan, stage=2).outcomes if o.check.pk == check.pk)
    assert outcome.result.status == "pass"
    assert outcome.result.summary.startswith("measured: 6 rules loaded")
    assert outcome.result.evidence[0].source == "queried from prom"
