"""Generated Prometheus alerting rules and Grafana dashboards, per pool and per plan.

Both read the same six signals of a pool, by the `pool` label Prometheus puts on its targets
(docs/prometheus.md gives the scrape configuration): vLLM's own histograms and gauges from the
pool's `/metrics` (TTFT and TPOT p95, queue depth `vllm:num_requests_waiting`, KV-cache usage
`vllm:gpu_cache_usage_perc`), the error rate from the gateway's (Envoy's) per-cluster counters
(each pool is a cluster named after it), and whether Prometheus can scrape the pool at all.

The thresholds are the SLO the pool is judged by: a plan's (per plan; per pool, the newest
open plan that has the pool as its candidate or primary), else fleetctl's defaults. The device
class (accelerator and runtime) names the group and labels every alert, so an on-call sees
which hardware pages. One alert group per pool, `fleetctl-pool-<name>`: the rules check
(evidence.py) asks Prometheus's rules API for exactly these names.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import yaml

# Without a plan: the SLO a new plan is usually given (docs/plans.md), shown as defaults.
DEFAULT_SLO = {"ttft_p95_ms": 1000.0, "tpot_p95_ms": 100.0, "error_rate": 0.01}
# Queue depth and KV-cache usage are the device's capacity, not the SLO: a queue this long,
# or a cache this full, for the alert's `for` is a pool about to miss its SLO.
QUEUE_DEPTH_LIMIT = 32
KV_CACHE_LIMIT = 0.95
RATE_WINDOW = "5m"
FOR = "5m"


@dataclass(frozen=True)
class Slo:
    ttft_p95_ms: float
    tpot_p95_ms: float
    error_rate: float
    origin: str  # "plan <name>" | "fleetctl's defaults"


@dataclass(frozen=True)
class PoolSignals:
    """The PromQL of each signal for one pool."""

    pool: str

    def _sel(self, extra: str = "") -> str:
        return "{" + f'pool="{self.pool}"' + (f",{extra}" if extra else "") + "}"

    def quantile(self, metric: str) -> str:
        return (f"histogram_quantile(0.95, sum by (le) (rate({metric}_bucket{self._sel()}"
                f"[{RATE_WINDOW}]))) * 1000")

    @property
    def ttft_p95_ms(self) -> str:
        return self.quantile("vllm:time_to_first_token_seconds")

    @property
    def tpot_p95_ms(self) -> str:
        return self.quantile("vllm:time_per_output_token_seconds")

    @property
    def error_rate(self) -> str:
        cluster = f'envoy_cluster_name="{self.pool}"'
        return (f'sum(rate(envoy_cluster_upstream_rq_xx{{{cluster},'
                f'envoy_response_code_class="5"}}[{RATE_WINDOW}])) / '
                f'sum(rate(envoy_cluster_upstream_rq_total{{{cluster}}}[{RATE_WINDOW}]))')

    @property
    def queue_depth(self) -> str:
        return f"sum(vllm:num_requests_waiting{self._sel()})"

    @property
    def kv_cache_usage(self) -> str:
        return f"max(vllm:gpu_cache_usage_perc{self._sel()})"

    @property
    def up(self) -> str:
        return f"min(up{self._sel()})"


def group_name(pool: str) -> str:
    return f"fleetctl-pool-{pool}"


ALERT_NAMES = ("FleetctlPoolDown", "FleetctlTTFTP95High", "FleetctlTPOTP95High",
               "FleetctlErrorRateHigh", "FleetctlQueueDepthHigh", "FleetctlKVCacheFull")


def pool_group(*, pool: str, accelerator: str, runtime: str, slo: Slo) -> dict[str, Any]:
    """One Prometheus rule group: the pool's six alerts."""
    s = PoolSignals(pool)
    device = f"{accelerator} ({runtime})"
    labels = {"pool": pool, "device_class": accelerator, "runtime": runtime,
              "source": "fleetctl"}

    def alert(name: str, expr: str, summary: str, severity: str = "page",
              for_: str = FOR) -> dict[str, Any]:
        return {"alert": name, "expr": expr, "for": for_,
                "labels": {**labels, "severity": severity},
                "annotations": {"summary": summary,
                                "slo": slo.origin, "dashboard": f"fleetctl pool {pool}"}}

    return {"name": group_name(pool), "rules": [
        alert("FleetctlPoolDown", f"{s.up} == 0",
              f"Prometheus cannot scrape pool {pool} on {device}", for_="2m"),
        alert("FleetctlTTFTP95High", f"{s.ttft_p95_ms} > {slo.ttft_p95_ms:g}",
              f"{pool} ({device}) TTFT p95 over {slo.ttft_p95_ms:g} ms ({slo.origin})"),
        alert("FleetctlTPOTP95High", f"{s.tpot_p95_ms} > {slo.tpot_p95_ms:g}",
              f"{pool} ({device}) TPOT p95 over {slo.tpot_p95_ms:g} ms ({slo.origin})"),
        alert("FleetctlErrorRateHigh", f"{s.error_rate} > {slo.error_rate:g}",
              f"{pool} ({device}) 5xx share over {slo.error_rate * 100:g} % at the gateway "
              f"({slo.origin})"),
        alert("FleetctlQueueDepthHigh", f"{s.queue_depth} > {QUEUE_DEPTH_LIMIT}",
              f"{pool} ({device}) has over {QUEUE_DEPTH_LIMIT} requests waiting",
              severity="ticket"),
        alert("FleetctlKVCacheFull", f"{s.kv_cache_usage} > {KV_CACHE_LIMIT:g}",
              f"{pool} ({device}) KV cache over {KV_CACHE_LIMIT * 100:g} % full",
              severity="ticket"),
    ]}


def rules_yaml(groups: list[dict[str, Any]], *, about: str) -> str:
    """A Prometheus rule file (`rule_files:`), with a comment saying what made it."""
    head = f"# Generated by fleetctl for {about}. Load it with rule_files: in prometheus.yml.\n"
    return head + yaml.safe_dump({"groups": groups}, sort_keys=False, width=200)


def dashboard(*, title: str, uid: str, pools: list[tuple[str, str, str]], slo: Slo
              ) -> dict[str, Any]:
    """A Grafana dashboard (JSON model, schemaVersion 39): one row per pool (name,
    accelerator, runtime), six panels each, the SLO as thresholds; the data source is a
    variable (`${datasource}`) chosen on import."""
    panels: list[dict[str, Any]] = []
    y = 0
    next_id = 1
    for pool, accelerator, runtime in pools:
        s = PoolSignals(pool)
        panels.append({"id": next_id, "type": "row", "title": f"{pool} · {accelerator} "
                       f"({runtime})", "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                       "collapsed": False, "panels": []})
        next_id += 1
        y += 1
        for index, (name, expr, unit, limit) in enumerate((
                ("TTFT p95", s.ttft_p95_ms, "ms", slo.ttft_p95_ms),
                ("TPOT p95", s.tpot_p95_ms, "ms", slo.tpot_p95_ms),
                ("Error rate (gateway 5xx)", s.error_rate, "percentunit", slo.error_rate),
                ("Queue depth (waiting)", s.queue_depth, "short", QUEUE_DEPTH_LIMIT),
                ("KV-cache usage", s.kv_cache_usage, "percentunit", KV_CACHE_LIMIT),
                ("Scraped (up)", s.up, "short", None))):
            thresholds: dict[str, Any] = {"mode": "absolute", "steps": [
                {"color": "green", "value": None}]}
            if limit is not None:
                thresholds["steps"].append({"color": "red", "value": limit})
            panels.append({
                "id": next_id, "type": "timeseries", "title": f"{pool}: {name}",
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": 8, "x": (index % 3) * 8, "y": y + (index // 3) * 8},
                "fieldConfig": {"defaults": {"unit": unit, "thresholds": thresholds,
                                             "custom": {"thresholdsStyle": {"mode": "line"}}},
                                "overrides": []},
                "targets": [{"refId": "A", "expr": expr, "legendFormat": pool,
                             "datasource": {"type": "prometheus", "uid": "${datasource}"}}],
            })
            next_id += 1
        y += 16
    return {
        "uid": uid, "title": title, "tags": ["fleetctl"], "schemaVersion": 39, "version": 1,
        "editable": True, "time": {"from": "now-6h", "to": "now"}, "refresh": "30s",
        "description": f"Generated by fleetctl. SLO: {slo.origin}.",
        "templating": {"list": [{"name": "datasource", "type": "datasource",
                                 "query": "prometheus", "label": "Prometheus"}]},
        "panels": panels,
    }


def dashboard_json(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=2, sort_keys=False) + "\n"
