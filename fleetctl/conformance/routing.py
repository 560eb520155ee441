"""The routing probe's requests and how each answer is judged: does the route's gateway send
every prompt only where the route's policy allows (issue 28)?

Per context tier of the route, two requests: one at the tier's lower end and one at its
bound (the open-ended last tier: twice the bound below, at least 1,000 tokens more), each a
tiny real prompt whose size is *stated* in the prompt-size header the gateway honours
(`x-fleetctl-prompt-tokens-stated`: the larger of its estimate and the stated count wins),
so the probe places a request exactly at a tier's edge without sending a long prompt to a
pool. Then one request whose size the gateway cannot read (no `messages`): it must go where
the last tier goes. A route without tiers gets one request. Every request carries the
route's latency class and, on a pinned route, its jurisdiction in the residency header (a
pinned route is matched by it).

Each answer is judged by the pool the gateway says answered it (`x-fleetctl-pool`, the
response header every routed answer carries), never by its status alone:

- a pool answered: it must be eligible for the tier (tiers.py: jurisdiction, latency class,
  stage, context) and, on a pinned route, sit in the route's jurisdiction; a request the
  gateway should have refused (a `reject` tier without a pool with weight: 413; another
  tier without one: 503) must never be answered by a pool: a refusal that reached a pool is
  a violation whatever it said;
- no pool answered: a refusal is right only where one is due; a 413 or 503 where a pool with
  weight may serve the tier is a violation too (the gateway refused what the policy allows);
- anything else (no answer, a 404 from a gateway that does not carry the route, a pool's own
  5xx) cannot be judged and is said so.

Failover that another pool answers (a pool down) is judged the same way: whichever pool
answered must be one the tier and the pin allow, so a pinned request that fails over abroad
or to a smaller pool is a violation.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from fleetctl.fleet.models import Pool
from fleetctl.traffic.gateways.base import (
    PROMPT_TOKENS_UNKNOWN,
    DesiredState,
    RouteSpec,
    TierSpec,
    tier_weights,
)
from fleetctl.traffic.gateways.envoy.names import POOL_HEADER
from fleetctl.traffic.models import Route
from fleetctl.traffic.tiers import TierPools

OPEN_TIER_EXTRA = 1_000  # tokens above the bound below for the open-ended tier's request
TIMEOUT_S = 30.0
PROMPT = "Reply with one word: ok."

OK, VIOLATION, UNJUDGED = "ok", "violation", "unjudged"


@dataclass
class Probe:
    """One request the probe sends, and what the policy allows for it."""

    label: str  # "tier 0 short", "tier 1 long", "unknown size", "untiered"
    tier: str  # the tier index as telemetry names it, "unknown", or "" (no tiers)
    stated: int | None  # tokens stated in the prompt-size header; None: none stated
    allowed: list[str]  # the pools the policy lets answer it
    refusal: int | None  # 413 or 503 when the gateway must answer itself, else None
    why_not: dict[str, str] = field(default_factory=dict)  # pool -> why it may not serve it
    messages: bool = True  # False: a body the gateway cannot size


@dataclass
class Outcome:
    label: str
    tier: str
    gateway: str
    stated: int | None
    allowed: list[str]
    refusal: int | None
    status: int | None = None
    pool: str = ""
    routed_tokens: str = ""  # the size the gateway says it routed by
    result: str = UNJUDGED
    detail: str = ""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _bounds(view: TierPools) -> tuple[int, int]:
    """The sizes of the tier's two requests: its lower end and its bound (the open-ended
    tier's: well above the bound below)."""
    low = view.above + 1 if view.index else 1
    bound = view.tier.max_prompt_tokens
    high = bound if bound is not None else max(2 * view.above, view.above + OPEN_TIER_EXTRA)
    return low, high


def _refusal(spec: RouteSpec | None, view: TierPools) -> int | None:
    """The answer the gateway owes a tier none of whose pools has weight: 413 for reject,
    503 otherwise; None when a pool may take it (or the route has no weights at all)."""
    if spec is None or not spec.weights:
        return None
    tier = TierSpec(bound=view.tier.max_prompt_tokens, above=view.above,
                    behaviour=view.tier.behaviour, pools=tuple(view.eligible_names))
    if tier_weights(spec, tier):
        return None
    return 413 if view.tier.behaviour == "reject" else 503


def plan_probes(route: Route, views: list[TierPools], spec: RouteSpec | None,
                eligible: set[str]) -> list[Probe]:
    """The requests for `route`: two per tier and one of unknown size, or one without
    tiers. `views`: the route's tiers with their eligible pools now; `spec`: the route as
    the gateway should hold it (its split); `eligible`: the pools that may carry the route
    at all (its model, its pin)."""
    if not views:
        return [Probe("untiered", "", None, sorted(eligible), None)]
    probes = []
    for view in views:
        why = {c.pool.name: reason for c, reason in view.others}
        low, high = _bounds(view)
        refusal = _refusal(spec, view)
        for which, size in (("short", low), ("long", high)):
            probes.append(Probe(f"tier {view.index} {which} ({size:,} tokens)", str(view.index),
                                size if view.index or which == "long" else None,
                                view.eligible_names, refusal, why))
    last = views[-1]
    probes.append(Probe("unknown size (goes where the last tier goes)", PROMPT_TOKENS_UNKNOWN,
                        None, last.eligible_names, _refusal(spec, last),
                        {c.pool.name: reason for c, reason in last.others}, messages=False))
    return probes


def headers_for(route: Route, desired: DesiredState, probe: Probe) -> dict[str, str]:
    headers = {"content-type": "application/json"}
    if route.latency_class:
        headers[desired.latency_class_header] = route.latency_class
    if route.residency:
        headers[desired.residency_header] = route.residency
    if probe.stated is not None:
        headers[desired.prompt_tokens_stated_header] = str(probe.stated)
    return headers


def body_for(route: Route, probe: Probe) -> bytes:
    body: dict[str, Any] = {"model": route.model_id, "max_tokens": 1}
    if probe.messages:
        body["messages"] = [{"role": "user", "content": PROMPT}]
    return json.dumps(body).encode()


def send(client: httpx.Client, url: str, gateway: str, route: Route, desired: DesiredState,
         probe: Probe, pools: dict[str, Pool]) -> Outcome:
    """Send one probe request through the gateway at `url` and judge the answer."""
    outcome = Outcome(probe.label, probe.tier, gateway, probe.stated, probe.allowed,
                      probe.refusal)
    try:
        answer = client.post(f"{url}/v1/chat/completions", content=body_for(route, probe),
                             headers=headers_for(route, desired, probe))
    except httpx.HTTPError as exc:
        outcome.detail = f"no answer from {gateway} at {url}: {type(exc).__name__}: {exc}"[:300]
        return outcome
    outcome.status = answer.status_code
    outcome.pool = answer.headers.get(POOL_HEADER, "")
    outcome.routed_tokens = answer.headers.get(desired.prompt_tokens_header, "")
    return judge(outcome, probe, route, pools, _error_code(answer))


def _error_code(answer: httpx.Response) -> str:
    try:
        error = answer.json().get("error") or {}
    except (ValueError, AttributeError):
        return ""
    return str(error.get("code") or "") if isinstance(error, dict) else ""


def judge(outcome: Outcome, probe: Probe, route: Route, pools: dict[str, Pool],
          code: str = "") -> Outcome:
    """The verdict on one answer (the module's rules)."""
    pool, status = outcome.pool, outcome.status or 0
    if pool:
        where = pools.get(pool)
        jurisdiction = where.region.jurisdiction if where is not None else None
        if route.residency and jurisdiction != route.residency:
            outcome.result = VIOLATION
            outcome.detail = (f"answered by {pool} in {jurisdiction or 'an unknown pool'}: "
                              f"the route is pinned to {route.residency}")
        elif probe.refusal is not None:
            outcome.result = VIOLATION
            outcome.detail = (f"answered by {pool}, but no pool with weight may serve "
                              f"{probe.label}: the gateway owed a {probe.refusal}")
        elif pool not in probe.allowed:
            outcome.result = VIOLATION
            reason = probe.why_not.get(pool) or "not among the route's pools"
            outcome.detail = f"answered by {pool}, which may not serve it ({reason})"
        elif status >= 500:
            outcome.detail = (f"{pool} may serve it, but answered {status}: placement right, "
                              f"the answer not judged")
            outcome.result = OK
        else:
            outcome.result = OK
            outcome.detail = f"answered by {pool} ({status}), one of {', '.join(probe.allowed)}"
        return outcome
    if probe.refusal is not None and status == probe.refusal:
        outcome.result = OK
        outcome.detail = f"refused by the gateway with {status} ({code or 'no code'}), as due"
    elif status in (413, 503) and probe.allowed and probe.refusal is None:
        outcome.result = VIOLATION
        outcome.detail = (f"the gateway refused it with {status} ({code or 'no code'}), "
                          f"though {', '.join(probe.allowed)} may serve it")
    else:
        due = (f"a {probe.refusal}" if probe.refusal is not None
               else f"one of {', '.join(probe.allowed) or 'no pool'}")
        outcome.detail = (f"no pool answered ({status}, {code or 'no code'}); expected "
                          f"{due}: not judged")
    return outcome


def summarise(outcomes: list[Outcome]) -> tuple[str, str]:
    """(verdict, one-line summary): fail on any violation; warn when some requests could
    not be judged; pass when every one was judged and held."""
    bad = [o for o in outcomes if o.result == VIOLATION]
    unjudged = [o for o in outcomes if o.result == UNJUDGED]
    judged = len(outcomes) - len(unjudged)
    parts = [f"{judged - len(bad)} of {len(outcomes)} requests routed as the policy says"]
    if bad:
        parts.append("violations: " + "; ".join(f"{o.label} via {o.gateway}: {o.detail}"
                                                 for o in bad[:3]))
    if unjudged:
        parts.append("not judged: " + "; ".join(f"{o.label}: {o.detail}"
                                                for o in unjudged[:2]))
    verdict = "fail" if bad else "warn" if unjudged else "pass"
    return verdict, "; ".join(parts)
