"""One query check: ask a metric source, read the values, judge them by the conditions.

A *query spec* is what a gate check or a ramp's guard declares: the source (by name), the
query (PromQL for a Prometheus; a path for an HTTP JSON source, whose `field` names the value
in the answer), and a success and/or a failure condition such as `result < 0.05`. `$pool`,
`$route` and `$model` in the query stand for the pool judged, its route and model.

What a measurement answers (as Argo Rollouts' analysis does, with no data never a pass):

- `insufficient` with the reason: the source did not answer (down, timeout, refused), answered
  an error, or answered no series (or NaN: a ratio over no requests);
- `fail`: the failure condition holds for any series, or the success condition (alone) does
  not hold for every series;
- `pass`: the success condition holds for every series (or the failure condition, alone,
  holds for none);
- `warn` (inconclusive): both conditions given and neither decides.

Conditions are a tiny language, parsed here and never evaluated as code: `result OP number`,
OP one of < <= > >= == !=, several joined by `and` or by `or` (not both).
"""

from __future__ import annotations

import math
import operator
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from fleetctl.core.destinations import METRICS, DestinationRefused, destination_request
from fleetctl.core.http import OutboundError, OutboundTimeout

if TYPE_CHECKING:
    from fleetctl.prometheus.models import MetricSource

PASS, WARN, FAIL, INSUFFICIENT = "pass", "warn", "fail", "insufficient"
# A person's test query with no condition: the values, not judged (never a gate's outcome).
ANSWERED = "answered"
MAX_QUERY_CHARS = 2000
MAX_BODY = 1 << 20  # a query answering more than 1 MiB is not a check's

_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge,
    "==": operator.eq, "!=": operator.ne}
_COMPARISON = re.compile(
    r"^\s*result\s*(<=|>=|==|!=|<|>)\s*([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)\s*$")


@dataclass(frozen=True)
class Condition:
    text: str
    joiner: str  # "and" | "or"
    terms: tuple[tuple[str, float], ...]

    def holds(self, value: float) -> bool:
        results = (_OPS[op](value, limit) for op, limit in self.terms)
        return all(results) if self.joiner == "and" else any(results)


def parse_condition(text: str) -> Condition:
    """`result < 0.05`, `result >= 0.9 and result <= 1`; ValueError saying what is wrong."""
    text = (text or "").strip()
    if not text:
        raise ValueError("an empty condition")
    if len(text) > 200:
        raise ValueError("a condition is at most 200 characters")
    lowered = f" {text.lower()} "
    if " and " in lowered and " or " in lowered:
        raise ValueError(f"{text!r} mixes 'and' and 'or': use one of them")
    joiner = "or" if " or " in lowered else "and"
    terms = []
    for part in re.split(rf"\s+{joiner}\s+", text, flags=re.IGNORECASE):
        match = _COMPARISON.match(part)
        if not match:
            raise ValueError(f"{part.strip()!r} is not 'result <op> <number>' (op: < <= > >= "
                             f"== !=)")
        limit = float(match.group(2))
        if not math.isfinite(limit):
            raise ValueError(f"{part.strip()!r} compares with a number that is not finite")
        terms.append((match.group(1), limit))
    return Condition(text, joiner, tuple(terms))


@dataclass(frozen=True)
class QuerySpec:
    source: str
    query: str
    success: str = ""
    failure: str = ""
    field: str = ""  # http-json sources: dotted path of the value in the answer
    name: str = ""  # shown in reasons; default: the query

    @property
    def label(self) -> str:
        return self.name or self.query

    def as_dict(self) -> dict[str, str]:
        return {k: v for k, v in (("source", self.source), ("query", self.query),
                                  ("success", self.success), ("failure", self.failure),
                                  ("field", self.field), ("name", self.name)) if v}


SPEC_FIELDS = ("source", "query", "success", "failure", "field", "name")


def spec_problems(raw: Any) -> tuple[QuerySpec | None, list[str]]:
    """A query spec from user input (a JSON object), or the problems, one line each. The
    source is checked to exist by the caller (it needs the database)."""
    if not isinstance(raw, dict):
        return None, ["a query check is an object with source, query and success and/or "
                      "failure"]
    problems = [f"{key}: unknown field (fields: {', '.join(SPEC_FIELDS)})"
                for key in sorted(set(raw) - set(SPEC_FIELDS))]
    values = {}
    for key in SPEC_FIELDS:
        value = raw.get(key, "")
        if not isinstance(value, str):
            problems.append(f"{key}: a string")
            value = ""
        values[key] = value.strip()
    if not values["source"]:
        problems.append("source: name the metric source (GET /api/v1/metric-sources/)")
    if not values["query"]:
        problems.append("query: the PromQL query (or, for an http-json source, the path)")
    elif len(values["query"]) > MAX_QUERY_CHARS:
        problems.append(f"query: at most {MAX_QUERY_CHARS} characters")
    if not values["success"] and not values["failure"]:
        problems.append("success/failure: give a success condition, a failure condition or "
                        "both (e.g. success 'result < 0.05')")
    for key in ("success", "failure"):
        if values[key]:
            try:
                parse_condition(values[key])
            except ValueError as exc:
                problems.append(f"{key}: {exc}")
    if len(values["name"]) > 80:
        problems.append("name: at most 80 characters")
    if problems:
        return None, problems
    return QuerySpec(**values), []


@dataclass
class Measurement:
    status: str  # pass | warn | fail | insufficient
    reason: str
    source: str
    query: str  # as sent (the placeholders filled in)
    values: list[dict[str, Any]] = field(default_factory=list)  # [{"labels": {..}, "value": x}]
    at: float = 0.0
    latency_ms: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "reason": self.reason, "source": self.source,
                "query": self.query, "values": self.values[:20],
                "series": len(self.values), "at": self.at,
                "latency_ms": None if self.latency_ms is None else round(self.latency_ms, 2)}


def fill(query: str, *, pool: str = "", route: str = "", model: str = "") -> str:
    """The query with $pool, $route and $model replaced (quotes and backslashes escaped, so a
    name cannot end a PromQL string)."""
    def quoted(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"')

    for name, value in (("$pool", pool), ("$route", route), ("$model", model)):
        query = query.replace(name, quoted(value))
    return query


def judge(spec: QuerySpec, values: list[dict[str, Any]]) -> tuple[str, str]:
    """The status and its reason for the values a query answered (already non-empty)."""
    numbers = [float(v["value"]) for v in values]
    shown = _shown(values)
    if any(math.isnan(n) for n in numbers):
        return INSUFFICIENT, f"{spec.label} answered NaN ({shown}): no data to judge"
    success = parse_condition(spec.success) if spec.success else None
    failure = parse_condition(spec.failure) if spec.failure else None
    if failure is not None:
        failing = [v for v, n in zip(values, numbers, strict=True) if failure.holds(n)]
        if failing:
            return FAIL, f"{spec.label} = {_shown(failing)}: failure condition " \
                         f"'{failure.text}' holds"
    if success is not None:
        if all(success.holds(n) for n in numbers):
            return PASS, f"{spec.label} = {shown}: '{success.text}' holds"
        if failure is None:
            return FAIL, f"{spec.label} = {shown}: success condition '{success.text}' " \
                         f"does not hold"
        return WARN, f"{spec.label} = {shown}: neither '{success.text}' nor " \
                     f"'{failure.text}' decides (inconclusive)"
    return PASS, f"{spec.label} = {shown}: failure condition " \
                 f"'{failure.text if failure else ''}' does not hold"


def _shown(values: list[dict[str, Any]]) -> str:
    def one(v: dict[str, Any]) -> str:
        labels = v.get("labels") or {}
        tag = ",".join(f"{k}={labels[k]}" for k in sorted(labels) if k != "__name__")
        return f"{_number(float(v['value']))}" + (f" {{{tag}}}" if tag and len(values) > 1
                                                  else "")
    text = ", ".join(one(v) for v in values[:5])
    return text + (f" … ({len(values)} series)" if len(values) > 5 else "")


def _number(value: float) -> str:
    if math.isnan(value) or math.isinf(value):
        return str(value)
    return f"{value:.4g}"


def measure(source: MetricSource, spec: QuerySpec, *, pool: str = "", route: str = "",
            model: str = "") -> Measurement:
    """Ask `source` once and judge the answer. Never raises for the source's trouble: every
    error is an insufficient measurement with the reason. A spec with no condition (a
    person's test query) is not judged: its values are `answered`."""
    query = fill(spec.query, pool=pool, route=route, model=model)
    started = time.time()
    result = Measurement(INSUFFICIENT, "", source.name, query, at=started)
    try:
        values, latency = _ask(source, spec, query)
    except _NoAnswer as exc:
        result.reason = f"{spec.label}: {exc} (queried from {source.name})"
        return result
    result.values, result.latency_ms = values, latency
    if not values:
        result.reason = f"{spec.label}: no series (queried from {source.name}): no data, " \
                        f"never a pass"
        return result
    if not spec.success and not spec.failure:
        result.status = ANSWERED
        result.reason = f"{spec.label} = {_shown(values)} (queried from {source.name}; no " \
                        f"condition given, not judged)"
        return result
    result.status, reason = judge(spec, values)
    result.reason = f"{reason} (queried from {source.name})"
    return result


class _NoAnswer(Exception):
    """The source gave nothing to judge; the message says why."""


def source_get(source: MetricSource, path: str, params: dict[str, str] | None = None,
               *, timeout_s: float | None = None) -> tuple[Any, float]:
    """GET `path` of the source (its base URL + path), checked for purpose `metrics`, the
    answer's JSON and the latency; _NoAnswer with the reason when there is none."""
    url = source.base_url.rstrip("/") + path
    if params:
        url += ("&" if "?" in url else "?") + urlencode(params)
    headers = {"Accept": "application/json"}
    if source.bearer_token:
        headers["Authorization"] = f"Bearer {source.bearer_token}"
    timeout = timeout_s or source.timeout_s
    try:
        response = destination_request("GET", url, purpose=METRICS, headers=headers,
                                       timeout_s=timeout, max_body=MAX_BODY)
    except DestinationRefused as exc:
        raise _NoAnswer(f"refused: {exc}") from exc
    except OutboundTimeout as exc:
        raise _NoAnswer(f"no answer within {timeout:g} s") from exc
    except OutboundError as exc:
        raise _NoAnswer(f"the source is unreachable ({exc})") from exc
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code != 200:
        why = body.get("error") if isinstance(body, dict) else response.text[:200]
        raise _NoAnswer(f"HTTP {response.status_code}: {why}")
    if body is None:
        raise _NoAnswer("the answer is not JSON")
    return body, response.latency_ms


def _ask(source: MetricSource, spec: QuerySpec, query: str
         ) -> tuple[list[dict[str, Any]], float]:
    if source.kind == "http-json":
        body, latency = source_get(source, query if query.startswith("/") else f"/{query}")
        return _json_values(body, spec.field), latency
    body, latency = source_get(source, "/api/v1/query", {"query": query})
    if not isinstance(body, dict) or body.get("status") != "success":
        why = body.get("error") if isinstance(body, dict) else "not a Prometheus answer"
        raise _NoAnswer(f"Prometheus answered an error: {why}")
    data = body.get("data") or {}
    kind, result = data.get("resultType"), data.get("result")
    if kind == "scalar" and isinstance(result, list) and len(result) == 2:
        return [{"labels": {}, "value": _float(result[1])}], latency
    if kind == "vector" and isinstance(result, list):
        return [{"labels": dict(item.get("metric") or {}), "value": _float(item["value"][1])}
                for item in result], latency
    raise _NoAnswer(f"a {kind or 'missing'} result: a check needs an instant vector or a "
                    f"scalar (wrap a range in an aggregation such as avg_over_time)")


def _float(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError) as exc:
        raise _NoAnswer(f"the value {value!r} is not a number") from exc


def _json_values(body: Any, path: str) -> list[dict[str, Any]]:
    node = body
    for part in [p for p in path.split(".") if p]:
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        elif isinstance(node, dict) and part in node:
            node = node[part]
        else:
            return []  # not there: no data
    if node is None:
        return []
    items = node if isinstance(node, list) else [node]
    if any(isinstance(i, bool) or not isinstance(i, (int, float, str)) for i in items):
        raise _NoAnswer(f"field {path or '(the answer)'} is not a number or a list of numbers")
    return [{"labels": {}, "value": _float(i)} for i in items]
