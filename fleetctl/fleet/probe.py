"""What a health probe asks a pool: `/v1/models` must answer 200 with a model list that
names every model the pool is configured to serve (its PoolModel rows: a server that came
back with another model, or none, must not take that model's traffic), and `/health` must
not fail when the server has one (404 means it has none). Each call is checked by
core.destinations first (a pool's name that now resolves to loopback or metadata is refused
and the probe fails, saying why) and goes to the address that was checked."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

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


def _models_from(body: bytes) -> list[str]:
    data = json.loads(body)
    return sorted(str(item["id"]) for item in data.get("data", []) if "id" in item)


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
    return ProbeResult(ok=True, status_code=200, latency_ms=models.latency_ms, models_seen=seen)


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
    return ProbeResult(ok=True, status_code=200, latency_ms=max(latencies), models_seen=seen)
