"""What a health probe asks a pool: `/v1/models` must answer 200 with a model list that
names every model the pool is configured to serve (its PoolModel rows: a server that came
back with another model, or none, must not take that model's traffic), and `/health` must
not fail when the server has one (404 means it has none). What the server says of itself is
kept as `reported`: its version from `GET /version` (vLLM's; None when it has none or says
nothing readable — "not reported", never a change), each model's `max_model_len` and the
weights `revision` its model card reports (vLLM has none; `fleetctl sim` reports one) from the
model list. Each call is checked by
core.destinations first (a pool's name that now resolves to loopback or metadata is refused
and the probe fails, saying why) and goes to the address that was checked."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from fleetctl.core.destinations import POOLS, destination_request
from fleetctl.core.http import OutboundError, OutboundResponse


def http_get(url: str, *, timeout_s: float) -> OutboundResponse:
    return destination_request("GET", url, purpose=POOLS, timeout_s=timeout_s,
                               max_body=65536)


@dataclass
class ProbeResult:
    ok: bool
    status_code: int | None = None
    latency_ms: float | None = None
    error: str = ""
    models_seen: list[str] = field(default_factory=list)
    # {"server_version": str | None, "max_model_len": {model: int}}: what the server reports
    # of itself; a field it does not report is None or missing, never a guess.
    reported: dict[str, Any] = field(default_factory=dict)


def _models_from(body: bytes) -> list[str]:
    data = json.loads(body)
    return sorted(str(item["id"]) for item in data.get("data", []) if "id" in item)


def _max_lengths(body: bytes) -> dict[str, int]:
    """Each listed model's `max_model_len` (vLLM's field), where it is a positive integer."""
    items = json.loads(body).get("data", [])
    return {str(item["id"]): item["max_model_len"] for item in items
            if isinstance(item, dict) and "id" in item
            and isinstance(item.get("max_model_len"), int)
            and not isinstance(item.get("max_model_len"), bool) and item["max_model_len"] > 0}


def _revisions(body: bytes) -> dict[str, str]:
    """Each listed model's weights revision (`revision` on its model card, where the server
    reports one as a short printable string): a model without one is not reported."""
    items = json.loads(body).get("data", [])
    return {str(item["id"]): item["revision"] for item in items
            if isinstance(item, dict) and "id" in item and isinstance(item.get("revision"), str)
            and 0 < len(item["revision"]) <= 64 and item["revision"].isprintable()}


def _server_version(root: str, timeout_s: float) -> str | None:
    """`GET /version`'s `version` (vLLM), or None: no such endpoint, an error, or an answer
    without a short printable version string."""
    try:
        answer = http_get(f"{root}/version", timeout_s=timeout_s)
        version = json.loads(answer.body).get("version") if answer.status_code == 200 else None
    except (OutboundError, ValueError, AttributeError):
        return None
    if isinstance(version, str) and 0 < len(version) <= 64 and version.isprintable():
        return version
    return None


def probe_endpoint(base_url: str, *, timeout_s: float,
                   configured: list[str] | None = None) -> ProbeResult:
    root = base_url.rstrip("/")
    # A trailing /v1 names the server's root, as the gateways read it (OpenAI clients'
    # habit of base URLs ending in /v1).
    root = root.removesuffix("/v1")
    try:
        models = http_get(f"{root}/v1/models", timeout_s=timeout_s)
    except OutboundError as exc:
        return ProbeResult(ok=False, error=str(exc))
    if models.status_code != 200:
        return ProbeResult(
            ok=False, status_code=models.status_code, latency_ms=models.latency_ms,
            error=f"GET {root}/v1/models answered HTTP {models.status_code}",
        )
    try:
        seen = _models_from(models.body)
    except (ValueError, TypeError, AttributeError, KeyError):
        return ProbeResult(
            ok=False, status_code=200, latency_ms=models.latency_ms,
            error=f"GET {root}/v1/models did not return an OpenAI model list",
        )
    missing = sorted(set(configured or []) - set(seen))
    if missing:
        return ProbeResult(
            ok=False, status_code=200, latency_ms=models.latency_ms, models_seen=seen,
            error="; ".join(f"model {m} is configured on the pool but {root}/v1/models "
                            f"does not list it" for m in missing),
        )
    try:
        health = http_get(f"{root}/health", timeout_s=timeout_s)
    except OutboundError as exc:
        return ProbeResult(ok=False, status_code=200, latency_ms=models.latency_ms,
                           error=str(exc), models_seen=seen)
    if health.status_code not in (200, 204, 404):
        return ProbeResult(
            ok=False, status_code=health.status_code, latency_ms=models.latency_ms,
            error=f"GET {root}/health answered HTTP {health.status_code}", models_seen=seen,
        )
    reported = {"server_version": _server_version(root, timeout_s),
                "max_model_len": _max_lengths(models.body),
                "model_revision": _revisions(models.body)}
    return ProbeResult(ok=True, status_code=200, latency_ms=models.latency_ms, models_seen=seen,
                       reported=reported)


def probe_pool(base_urls: list[str], *, timeout_s: float,
               configured: list[str] | None = None) -> ProbeResult:
    """A pool is up only when every endpoint is: a half-dead pool should not take traffic.
    `configured`: the models every endpoint must list."""
    results = [probe_endpoint(url, timeout_s=timeout_s, configured=configured)
               for url in base_urls]
    failed = [r for r in results if not r.ok]
    latencies = [r.latency_ms for r in results if r.latency_ms is not None]
    seen = sorted({m for r in results for m in r.models_seen})
    if failed:
        first = failed[0]
        return ProbeResult(ok=False, status_code=first.status_code,
                           latency_ms=max(latencies) if latencies else None,
                           error="; ".join(r.error for r in failed), models_seen=seen)
    return ProbeResult(ok=True, status_code=200, latency_ms=max(latencies), models_seen=seen,
                       reported=_pool_reported([r.reported for r in results]))


def _pool_reported(each: list[dict[str, Any]]) -> dict[str, Any]:
    """The pool's self-description from its endpoints': a version every endpoint reported
    (endpoints that disagree, a rolling upgrade half done, report all of theirs, sorted), and
    the smallest max_model_len each model is listed with."""
    versions = sorted({str(r["server_version"]) for r in each if r.get("server_version")})
    version = None if not versions or any(not r.get("server_version") for r in each) else \
        ",".join(versions)
    lengths: dict[str, int] = {}
    for r in each:
        for model, length in (r.get("max_model_len") or {}).items():
            lengths[model] = min(length, lengths.get(model, length))
    # A model's revision when every endpoint reports one (those that disagree: all, sorted).
    listed = [r.get("model_revision") or {} for r in each]
    revisions = {model: ",".join(sorted({str(one[model]) for one in listed}))
                 for model in sorted(set().union(*listed))
                 if all(one.get(model) for one in listed)}
    return {"server_version": version, "max_model_len": lengths, "model_revision": revisions}
