"""The evidence kinds this app's measurements produce, and the rules that read them.

`metric-query`: a query check of a plan's gate (rule `metrics.query`) is measured every
`interval_s` by the producer (services.gate_queries_measure, beat); each measurement is one
row about the plan's candidate, "queried from <source>", with the query as sent and the
values. The check reads its newest `count` rows: every one must pass (Argo Rollouts' count
with no failures allowed); one failing fails it; no data is never a pass.

`alerts-loaded`: the rules check (rule `alerts.loaded`) asks the source's rules API whether
the candidate's generated alert group (generate.py) is loaded; the newest row decides.
"""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

from migrations_plan.evidence import (
    ANY_OBJECT,
    FAIL,
    INSUFFICIENT,
    PASS,
    WARN,
    CheckResult,
    EvidenceKind,
    Param,
    Rule,
    RuleContext,
    data_schema,
    evidence_ref,
    register_kind,
    register_rule,
)

QUERY_KIND = "metric-query"
QUERY_RULE = "metrics.query"
QUERY_PRODUCED_BY = ("query checks of a plan's gate, measured every interval from the named "
                     "metric source (the prometheus app's beat task)")
ALERTS_KIND = "alerts-loaded"
ALERTS_RULE = "alerts.loaded"
ALERTS_PRODUCED_BY = ("the rules check: the metric source's rules API (/api/v1/rules) asked "
                      "for the candidate's generated alert group")
NONE = "none"  # a rule's optional text parameter left out

QUERY_DATA_SCHEMA: dict[str, Any] = data_schema({
    "check": {"type": "string"},
    "source": {"type": "string"},
    "query": {"type": "string"},
    "success": {"type": "string"},
    "failure": {"type": "string"},
    "measurement": ANY_OBJECT,
})
ALERTS_DATA_SCHEMA: dict[str, Any] = data_schema({
    "source": {"type": "string"},
    "group": {"type": "string"},
    "expected": {"type": "array", "items": {"type": "string"}},
    "loaded": {"type": "array", "items": {"type": "string"}},
    "missing": {"type": "array", "items": {"type": "string"}},
    "reason": {"type": "string"},
})


def optional(value: str) -> str:
    return "" if value.strip().lower() == NONE else value.strip()


def check_digest(params: dict[str, Any]) -> str:
    """What identifies one query check's measurements: its source, query and conditions
    (a changed query is another check, whose old rows do not count)."""
    key = {k: params.get(k) for k in ("source", "query", "success", "failure", "field")}
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def _unknown_source(value: Any) -> str | None:
    from fleetctl.prometheus.models import MetricSource

    names = list(MetricSource.objects.order_by("name").values_list("name", flat=True))
    if value in names:
        return None
    return (f"no metric source named {value!r} ("
            + (f"sources: {', '.join(names)}" if names else "none is registered")
            + "; an administrator adds them: POST /api/v1/metric-sources/)")


def _condition_problem(value: Any) -> str | None:
    from fleetctl.prometheus.query import parse_condition

    if not isinstance(value, str) or optional(value) == "":
        return None
    try:
        parse_condition(value)
    except ValueError as exc:
        return str(exc)
    return None


def query_holds(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    count, interval = int(params["count"]), float(params["interval_s"])
    digest = check_digest(params)
    valid, _ = ctx.evidence(QUERY_KIND)
    rows = [r for r in valid if (r.data or {}).get("check") == digest]
    recent = ctx.now - timedelta(seconds=interval * (count + 1) + 60)
    rows = [r for r in rows if r.observed_at >= recent][:count]
    numbers: dict[str, Any] = {"source": params["source"], "query": params["query"],
                               "count": count, "interval_s": interval,
                               "measured": [r.verdict for r in rows]}
    refs = [evidence_ref(r) for r in rows]
    if not rows:
        return CheckResult(INSUFFICIENT, f"No measurement of {params['query']!r} from "
                                         f"{params['source']} in the last "
                                         f"{interval * (count + 1) + 60:g} s. It comes from "
                                         f"{QUERY_PRODUCED_BY}.", numbers)
    failed = [r for r in rows if r.verdict == FAIL]
    if failed:
        return CheckResult(FAIL, failed[0].summary, numbers, refs)
    unknown = [r for r in rows if r.verdict not in (PASS, WARN)]
    if unknown:
        return CheckResult(INSUFFICIENT, unknown[0].summary, numbers, refs)
    if len(rows) < count:
        return CheckResult(INSUFFICIENT, f"{len(rows)} of {count} measurements so far, every "
                                         f"{interval:g} s: {rows[0].summary}", numbers, refs)
    warned = [r for r in rows if r.verdict == WARN]
    if warned:
        return CheckResult(WARN, warned[0].summary, numbers, refs)
    return CheckResult(PASS, f"{count} measurements in a row pass: {rows[0].summary}",
                       numbers, refs)


def alerts_loaded(ctx: RuleContext, params: dict[str, Any]) -> CheckResult:
    from fleetctl.prometheus.generate import ALERT_NAMES, group_name

    valid, _ = ctx.evidence(ALERTS_KIND, within_days=float(params["within_days"]))
    group = group_name(ctx.candidate.name)
    rows = [r for r in valid if (r.data or {}).get("group") == group
            and (r.data or {}).get("source") == params["source"]
            and list((r.data or {}).get("expected") or []) == list(ALERT_NAMES)]
    if not rows:
        return CheckResult(INSUFFICIENT, f"Not measured yet: {params['source']} has not been "
                                         f"asked for {group}. It comes from "
                                         f"{ALERTS_PRODUCED_BY}.")
    row = rows[0]
    status = {"pass": PASS, "fail": FAIL}.get(row.verdict, INSUFFICIENT)
    return CheckResult(status, row.summary, {"data": row.data}, [evidence_ref(row)])


def register() -> None:
    register_kind(EvidenceKind(QUERY_KIND, "metric query", QUERY_PRODUCED_BY,
                               data_schema=QUERY_DATA_SCHEMA))
    register_kind(EvidenceKind(ALERTS_KIND, "alerting rules loaded", ALERTS_PRODUCED_BY,
                               data_schema=ALERTS_DATA_SCHEMA))
    register_rule(Rule(
        QUERY_RULE, QUERY_KIND, "{query} ({source})",
        "A PromQL query (or an http-json path) asked of a registered metric source every "
        "interval; the newest `count` measurements must all pass their condition. An error, "
        "a timeout, a source that is down or no series is insufficient data, never a pass.",
        {"source": Param(str, "prometheus", "metric source name (GET /api/v1/metric-sources/)",
                         refuse=_unknown_source),
         "query": Param(str, "up", "PromQL ($pool, $route, $model are filled in); an "
                                   "http-json source: the path"),
         "success": Param(str, NONE, "success condition, e.g. 'result < 0.05' (none: only "
                                     "the failure condition)", refuse=_condition_problem),
         "failure": Param(str, NONE, "failure condition, e.g. 'result > 0.1' (none: only "
                                     "the success condition)", refuse=_condition_problem),
         "field": Param(str, NONE, "http-json sources: dotted path of the value"),
         "interval_s": Param(float, 60.0, "seconds between measurements", 5, 86400),
         "count": Param(int, 3, "measurements that must all pass", 1, 100)},
        query_holds))
    register_rule(Rule(
        ALERTS_RULE, ALERTS_KIND, "Generated alerts loaded in {source}",
        "The metric source's rules API lists the candidate's generated alert group "
        "(fleetctl-pool-<pool>, six alerts): measured, where it was attested. Missing rules "
        "are named; a source that does not answer is insufficient data.",
        {"source": Param(str, "prometheus", "metric source name (a Prometheus)",
                         refuse=_unknown_source),
         "within_days": Param(float, 1.0, "oldest acceptable measurement, days", 0.001, 30)},
        alerts_loaded))
