"""The routes file's content (RDS): one Envoy route per RouteSpec, the error answers
around them, and the per-route policies (retries, mirroring, runtime keys)."""

from __future__ import annotations

import json
from typing import Any

from fleetctl.traffic.gateways.base import (
    MIRROR_AUTH_HEADER,
    MIRROR_HEADER,
    PROMPT_TOKENS_UNKNOWN,
    DesiredState,
    RouteSpec,
    TierSpec,
    openai_error,
    tier_weights,
)
from fleetctl.traffic.gateways.envoy.affinity import hash_policy
from fleetctl.traffic.gateways.envoy.fallback import tier_entries
from fleetctl.traffic.gateways.envoy.lua import routing_lua
from fleetctl.traffic.gateways.envoy.names import (
    ANSWERED_BY,
    COLLECTOR_CLUSTER,
    FALLBACK_BACK_OFF,
    HOST_SELECTION_RETRY_MAX_ATTEMPTS,
    LUA_FILTER,
    LUA_PER_ROUTE_TYPE,
    MIRROR_KEY,
    MODEL_CHARS,
    NUM_RETRIES,
    POOL_HEADER,
    PREVIOUS_HOSTS_TYPE,
    PREVIOUS_PRIORITIES_TYPE,
    RETRY_ON,
    ROUTE_CONFIG_NAME,
    ROUTE_CONFIG_TYPE,
    RUNTIME_ROOT,
    digest,
    fraction,
)


def render_route_config(desired: DesiredState) -> dict[str, Any]:
    return {
        "@type": ROUTE_CONFIG_TYPE,
        "name": ROUTE_CONFIG_NAME,
        "virtual_hosts": [{
            "name": "fleetctl",
            "domains": ["*"],
            "routes": _routes(desired),
            # The script arrives with the routes, so the header it writes always is the one
            # these routes match on, and the bootstrap never changes.
            "typed_per_filter_config": {LUA_FILTER: {
                "@type": LUA_PER_ROUTE_TYPE,
                "source_code": {"inline_string": routing_lua(desired)},
            }},
        }],
    }


def render_unconfigured_route_config() -> dict[str, Any]:
    """What a gateway holds before fleetctl first pushes to it: every request gets a 503."""
    return {
        "@type": ROUTE_CONFIG_TYPE,
        "name": ROUTE_CONFIG_NAME,
        "virtual_hosts": [{"name": "fleetctl", "domains": ["*"], "routes": [_error_route(
            "fleetctl:unconfigured", {"prefix": "/"}, 503, "service_unavailable",
            "gateway_unconfigured", "this gateway has not been configured by fleetctl yet",
        )]}],
    }


def _routes(desired: DesiredState) -> list[dict[str, Any]]:
    """Most specific first. Per model: routes pinned to a jurisdiction, then a refusal of any
    other jurisdiction, then unpinned routes (which also require the header to be absent)."""
    models = sorted({route.model for route in desired.routes})
    entries = _models_routes(models)
    for model in models:
        specs = [route for route in desired.routes if route.model == model]
        pinned = sorted((r for r in specs if r.residency), key=_specificity)
        unpinned = sorted((r for r in specs if not r.residency), key=_specificity)
        for route in pinned:
            entries += [*_tier_routes(route, desired), _spec_route(route, desired)]
        entries.append(_residency_refused(model, desired))
        for route in unpinned:
            entries += [*_tier_routes(route, desired), _spec_route(route, desired)]
        entries.append(_no_route_for(model, desired))
    entries += _fallback_routes(desired)
    return entries


def _specificity(route: RouteSpec) -> tuple[bool, str, str]:
    return (not route.latency_class, route.residency, route.key)


def _route_headers(route: RouteSpec, desired: DesiredState) -> list[dict[str, Any]]:
    headers = [_exact(desired.model_header, route.model)]
    if route.latency_class:
        headers.append(_exact(desired.latency_class_header, route.latency_class))
    headers.append(_exact(desired.residency_header, route.residency) if route.residency
                   else _absent(desired.residency_header))
    return headers


def _spec_route(route: RouteSpec, desired: DesiredState) -> dict[str, Any]:
    match = {"prefix": "/v1/", "headers": _route_headers(route, desired)}
    if not route.weights:
        where = f"in jurisdiction {route.residency} " if route.residency else ""
        return _error_route(
            route.key, match, 503, "service_unavailable", "no_pool_available",
            f"route {route.key}: no pool {where}may serve model {route.model} now",
        )
    return _weighted_route(route.key, match, route.weights, runtime_prefix(route, desired),
                           route, desired)


# The largest value Envoy's Int64Range takes: the open end of the last tier's range.
INT64_MAX = 2**63 - 1
TIER_METADATA = "fleetctl"  # filter_metadata namespace of a tier entry: {"tier": index}
# The gateway's estimate of a prompt's size errs (benchmarks/tier_mix.py: p95 |error| ~5 % on
# documents of 8k-32k tokens, mostly under): a prompt estimated within this share of a tier's
# bound goes to the next tier up, whose pools serve more, so an under-estimate never sends a
# prompt to a pool too small for it. Not where the next tier has no pool (413 or 503): there
# the bound is the bound, and a prompt that turns out too long is refused by the pool itself.
ESTIMATE_MARGIN_PCT = 8


def _tier_routes(route: RouteSpec, desired: DesiredState) -> list[dict[str, Any]]:
    """One entry per context tier, before the route's own: the route's matchers plus an
    integer range on the prompt-size header ([above + 1, bound + 1): Envoy's range end is
    exclusive), then one for `unknown` that goes where the last tier goes (the most
    restrictive: its pools serve the largest prompts). The last tier's range is open-ended,
    so a prompt above the last bound goes there too, never back to the whole split. A
    request whose header matches none of them (no header) follows the route's own entry.
    Each entry's split is the route's restricted to the tier's pools (`tier_weights`), read
    from runtime keys beside the route's, so a ramp stays a runtime change. A tier without a
    pool answers itself: 413 when it rejects, else 503. Each pool of a split may name a
    fallback or queue cluster (fallback.py). A route with no weights (fails closed) gets no
    tier entries. Between two tiers that both have pools the cut is ESTIMATE_MARGIN_PCT
    below the bound."""
    if not route.tiers or not route.weights:
        return []
    entries = []
    last = len(route.tiers) - 1
    start = 0
    for index, tier in enumerate(route.tiers):
        end = (INT64_MAX if index == last or tier.bound is None
               else tier_cut(route, index) + 1)
        size = {"name": desired.prompt_tokens_header,
                "range_match": {"start": start, "end": end}}
        entries.append(_tier_route(route, desired, index, size, unknown=False))
        start = end
    unknown = _exact(desired.prompt_tokens_header, PROMPT_TOKENS_UNKNOWN)
    entries.append(_tier_route(route, desired, last, unknown, unknown=True))
    return entries


def tier_cut(route: RouteSpec, index: int) -> int:
    """The largest estimated prompt the tier takes: its bound, less ESTIMATE_MARGIN_PCT when
    the next tier has pools to take what lies above the cut."""
    bound = route.tiers[index].bound
    assert bound is not None
    following = route.tiers[index + 1] if index + 1 < len(route.tiers) else None
    if following is None or not tier_weights(route, following):
        return bound
    return max(1, bound * 100 // (100 + ESTIMATE_MARGIN_PCT))


def tier_runtime_prefix(route: RouteSpec, tier: TierSpec, index: int,
                        desired: DesiredState) -> str:
    """The tier's weights' runtime keys: beside the route's, with the tier's own shape (its
    clusters name its fallbacks and queue, so a new list of them is a new shape)."""
    shape = [tier.bound, tier.above,
             sorted(entry.cluster for entry in tier_entries(route, tier, index, desired))]
    return f"{runtime_prefix(route, desired)}.tier{index}-{digest(shape)[:8]}"


def tier_runtime(route: RouteSpec, tier: TierSpec, index: int,
                 desired: DesiredState) -> dict[str, int]:
    """The tier's runtime keys and weights (`<tier prefix>.<cluster>`)."""
    prefix = tier_runtime_prefix(route, tier, index, desired)
    return {f"{prefix}.{entry.cluster}": entry.weight
            for entry in tier_entries(route, tier, index, desired)}


def _tier_route(route: RouteSpec, desired: DesiredState, index: int,
                size: dict[str, Any], *, unknown: bool) -> dict[str, Any]:
    tier = route.tiers[index]
    match = {"prefix": "/v1/", "headers": [*_route_headers(route, desired), size]}
    found = tier_entries(route, tier, index, desired)
    if not found:
        name = f"fleetctl:tier:{route.key}:{'unknown' if unknown else index}"
        if tier.behaviour == "reject":
            return _tier_rejected(route, desired, name, match, tier, unknown=unknown)
        return _error_route(
            name, match, 503, "service_unavailable", "no_pool_available",
            f"route {route.key}: no pool may serve prompts of {tier.label} of model "
            f"{route.model} now")
    entry = _weighted_route(route.key, match, {e.cluster: e.weight for e in found},
                            tier_runtime_prefix(route, tier, index, desired), route, desired,
                            fallback=any(len(e.tries) > 1 for e in found))
    metadata: dict[str, Any] = {TIER_METADATA: {"tier": index, "unknown": unknown}}
    if tier.behaviour == "queue":
        metadata[LUA_FILTER] = queue_full_answer(route, tier)
    entry["metadata"] = {"filter_metadata": metadata}
    return entry


def queue_full_answer(route: RouteSpec, tier: TierSpec) -> dict[str, str]:
    """What the Lua script answers instead of Envoy's 503 when the tier's queue is full:
    429, Retry-After, and an OpenAI-style error saying so (route metadata it reads)."""
    retry_after = tier.retry_after_s or 1
    message = (f"route {route.key}: the queue of tier {tier.label} of model {route.model} is "
               f"full ({tier.queue_max} waiting per pool, every slot busy); retry after "
               f"{retry_after} s")
    body = openai_error(message, "rate_limit_error", "tier_queue_full")
    return {"queue_full_body": json.dumps(body, separators=(",", ":")),
            "retry_after": str(retry_after)}


def _tier_rejected(route: RouteSpec, desired: DesiredState, name: str,
                   match: dict[str, Any], tier: TierSpec, *, unknown: bool) -> dict[str, Any]:
    """413, OpenAI-style: the tier, the prompt size the gateway measured and the limit."""
    limit = tier.above if tier.bound is None else tier.bound
    if unknown:
        message = (f"route {route.key}: the prompt size could not be read from the body, so "
                   f"it counts as the largest tier ({tier.label}), which is refused: prompts "
                   f"of model {route.model} may have at most {limit} tokens here. State the "
                   f"size in {desired.prompt_tokens_stated_header}.")
        return _error_route(name, match, 413, "invalid_request_error",
                            "context_length_exceeded", message)
    tokens = f"%REQ({desired.prompt_tokens_header}):16%"
    message = (f"route {route.key}: the prompt has about {tokens} tokens; tier "
               f"{tier.label} refuses it (reject): prompts of model {route.model} may have "
               f"at most {limit} tokens here")
    return _error_route(name, match, 413, "invalid_request_error", "context_length_exceeded",
                        message, dynamic=True)


def is_tier_entry(entry: dict[str, Any]) -> bool:
    """A tier's entry (named like its route, so the access log attributes its requests to
    the route): read-backs of the route's own weights and mirror skip it."""
    meta = (entry.get("metadata") or {}).get("filter_metadata") or {}
    return "tier" in (meta.get(TIER_METADATA) or {})


def _weighted_route(name: str, match: dict[str, Any], weights: dict[str, int], prefix: str,
                    route: RouteSpec, desired: DesiredState, *,
                    fallback: bool = False) -> dict[str, Any]:
    """`weights`: cluster name -> weight (a pool's own cluster, or a tier's: fallback.py)."""
    action: dict[str, Any] = {
        "weighted_clusters": {
            "runtime_key_prefix": prefix,
            "clusters": [{"name": pool, "weight": weights[pool]} for pool in sorted(weights)],
        },
        "timeout": "0s",
        "auto_host_rewrite": True,
        "retry_policy": retry_policy(fallback=fallback),
    }
    if desired.mirror_url:
        action["request_mirror_policies"] = [mirror_policy(route, desired)]
    if route.affinity:
        action["hash_policy"] = hash_policy(route)
    return {
        "name": name,
        "match": match,
        "route": action,
        # The pool that answered, and the prompt size the gateway routed by (what the Lua
        # script set: its estimate, the caller's larger count, or "unknown").
        "response_headers_to_add": [{
            "header": {"key": POOL_HEADER, "value": ANSWERED_BY},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }, {
            "header": {"key": desired.prompt_tokens_header,
                       "value": f"%REQ({desired.prompt_tokens_header}):16%"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }],
    }


def retry_policy(*, fallback: bool = False) -> dict[str, Any]:
    """Retry a request that failed before any byte of it reached a server (RETRY_ON) on
    another endpoint of the same pool; the access log counts the attempts. With `fallback`
    (a tier entry naming aggregate clusters, fallback.py), each retry goes to the next pool
    of the aggregate not tried yet: each pool is a priority of the aggregate, and
    previous_priorities excludes those tried; with a back-off of a millisecond or so, since
    the retry goes to another pool (FALLBACK_BACK_OFF)."""
    policy: dict[str, Any] = {
        "retry_on": RETRY_ON,
        "num_retries": NUM_RETRIES,
        "retry_host_predicate": [{
            "name": "envoy.retry_host_predicates.previous_hosts",
            "typed_config": {"@type": PREVIOUS_HOSTS_TYPE},
        }],
        "host_selection_retry_max_attempts": HOST_SELECTION_RETRY_MAX_ATTEMPTS,
    }
    if fallback:
        policy["retry_priority"] = {
            "name": "envoy.retry_priorities.previous_priorities",
            "typed_config": {"@type": PREVIOUS_PRIORITIES_TYPE, "update_frequency": 1},
        }
        policy["retry_back_off"] = dict(FALLBACK_BACK_OFF)
    return policy


def mirror_policy(route: RouteSpec, desired: DesiredState) -> dict[str, Any]:
    """Copy the route's requests, `mirror_bp` of 10,000 of them, to the shadow collector.
    The share is a runtime key beside the weights' (one /runtime_modify changes it, no file
    swap; the runtime file keeps it over a restart); the default is what a freshly loaded
    file means. Envoy sends the copy and never waits for it: its answer, or its absence, is
    dropped, so a slow or dead collector costs the live request nothing. Only the copy
    carries MIRROR_HEADER and MIRROR_AUTH_HEADER (the live pool never sees them), each
    overwriting what the client sent; without a mirror_auth the client's is removed. Envoy
    appends "-shadow" to the copy's Host."""
    auth: dict[str, Any] = {"remove": MIRROR_AUTH_HEADER}
    if route.mirror_auth:
        auth = {"append": {
            "header": {"key": MIRROR_AUTH_HEADER, "value": route.mirror_auth},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }}
    return {
        "cluster": COLLECTOR_CLUSTER,
        "runtime_fraction": {
            "default_value": fraction(route.mirror_bp),
            "runtime_key": f"{runtime_prefix(route, desired)}.{MIRROR_KEY}",
        },
        "request_headers_mutations": [{"append": {
            "header": {"key": MIRROR_HEADER, "value": route.key},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        }}, auth],
    }


def runtime_prefix(route: RouteSpec, desired: DesiredState) -> str:
    """`fleetctl.<route>.<shape hash>`: a new shape of the route never reads the runtime
    weights of an old one (whose pools may differ, or all be 0 for the new list)."""
    shape = [route.model, route.latency_class, route.residency, sorted(route.weights),
             desired.model_header, desired.residency_header, desired.latency_class_header]
    return f"{RUNTIME_ROOT}.{route.key}.{digest(shape)[:8]}"


def _residency_refused(model: str, desired: DesiredState) -> dict[str, Any]:
    match = {"prefix": "/v1/", "headers": [_exact(desired.model_header, model),
                                           _present(desired.residency_header)]}
    jurisdiction = f"%REQ({desired.residency_header}):64%"
    return _error_route(
        f"fleetctl:residency:{model}", match, 403, "invalid_request_error",
        "residency_unavailable",
        f"no route serves model {model} in jurisdiction {jurisdiction}", dynamic=True,
    )


def _no_route_for(model: str, desired: DesiredState) -> dict[str, Any]:
    match = {"prefix": "/v1/", "headers": [_exact(desired.model_header, model)]}
    latency = f"%REQ({desired.latency_class_header}):64%"
    return _error_route(
        f"fleetctl:no-route:{model}", match, 404, "invalid_request_error", "route_not_found",
        f"no route serves model {model} for latency class {latency}", dynamic=True,
    )


def _fallback_routes(desired: DesiredState) -> list[dict[str, Any]]:
    unknown = {"prefix": "/v1/", "headers": [_present(desired.model_header)]}
    missing = {"prefix": "/v1/", "headers": [_exact(":method", "POST")]}
    return [
        _error_route("fleetctl:unknown-model", unknown, 404, "invalid_request_error",
                     "model_not_found",
                     f"The model `%REQ({desired.model_header})%` does not exist "
                     "or no route serves it", dynamic=True),
        _error_route("fleetctl:missing-model", missing, 400, "invalid_request_error",
                     "missing_model", "the JSON body needs a top-level string `model` "
                     f"of the characters {MODEL_CHARS}"),
        _error_route("fleetctl:unknown-url", {"prefix": "/"}, 404, "invalid_request_error",
                     "unknown_url", "Unknown request URL: %REQ(:METHOD)% %REQ(:PATH):256%",
                     dynamic=True),
    ]


def _models_routes(models: list[str]) -> list[dict[str, Any]]:
    """GET /v1/models lists the models this gateway routes (not what each pool serves:
    the gateway answers for the set, and a pool's own list may be wider)."""
    listing = {"object": "list", "data": [_model_object(m) for m in models]}
    entries = [_static_route("fleetctl:models", {"path": "/v1/models"}, 200, listing)]
    entries += [_static_route(f"fleetctl:model:{m}", {"path": f"/v1/models/{m}"}, 200,
                              _model_object(m)) for m in models]
    return entries


def _model_object(model: str) -> dict[str, Any]:
    return {"id": model, "object": "model", "created": 0, "owned_by": "fleetctl"}


def _error_route(name: str, match: dict[str, Any], status: int, kind: str, code: str,
                 message: str, *, dynamic: bool = False) -> dict[str, Any]:
    """An OpenAI-style error answered by Envoy itself. `dynamic` messages contain Envoy
    format commands (json_format escapes what they expand to); others are static text."""
    if not dynamic:
        message = message.replace("%", "%%")
    body = openai_error(message, kind, code)
    return {"name": name, "match": match, "direct_response": {
        "status": status, "body_format": {"json_format": body},
    }}


def _static_route(name: str, match: dict[str, Any], status: int,
                  body: dict[str, Any]) -> dict[str, Any]:
    text = json.dumps(body, separators=(",", ":")).replace("%", "%%")
    return {"name": name, "match": match, "direct_response": {
        "status": status, "body_format": {
            "text_format_source": {"inline_string": text}, "content_type": "application/json",
        },
    }}


def _exact(header: str, value: str) -> dict[str, Any]:
    return {"name": header, "string_match": {"exact": value}}


def _present(header: str) -> dict[str, Any]:
    return {"name": header, "present_match": True}


def _absent(header: str) -> dict[str, Any]:
    return {"name": header, "present_match": True, "invert_match": True}


def without_weights(node: Any) -> Any:
    """The route config minus default weights and mirror fractions: two configs that differ
    only in those have the same version, and such a change goes through the runtime, not a
    file swap."""
    if isinstance(node, dict):
        if "runtime_fraction" in node and "cluster" in node:  # a request mirror policy
            node = {**node, "runtime_fraction": {
                k: v for k, v in node["runtime_fraction"].items() if k != "default_value"}}
        if "weighted_clusters" in node:
            node = {**node, "weighted_clusters": {
                **node["weighted_clusters"],
                "clusters": [{k: v for k, v in c.items() if k != "weight"}
                             for c in node["weighted_clusters"]["clusters"]],
            }}
        return {key: without_weights(value) for key, value in node.items()}
    if isinstance(node, list):
        return [without_weights(item) for item in node]
    return node
