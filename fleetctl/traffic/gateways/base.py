"""The contract every gateway adapter fulfils, and the registry that finds one by kind.

fleetctl always sends a gateway its whole desired state (every route it serves, at that
route's current revision), so a push and a reconcile are the same idempotent operation and a
gateway that restarted empty is repaired by the next one.

Weights are integers in basis points (1/100 of a percent) and each route's weights sum to
10,000 — or the route has no weights at all, which means "no pool may serve this route"
(residency fails closed): the gateway must answer such requests with an error, never send
them anywhere. A pool with weight 0 must receive no new requests.
"""

from __future__ import annotations

import re
import subprocess
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar
from urllib.parse import urlsplit

TOTAL_WEIGHT = 10_000
# The header every mirrored request carries: the key of the route it was copied from, so the
# shadow collector knows which run it belongs to.
MIRROR_HEADER = "x-fleetctl-shadow-route"
# And the proof that a gateway of that route sent it: "<gateway id>.<HMAC of the route key with
# the gateway's mirror secret>" (fleetctl/traffic/mirror_auth.py), set on the copy alone and
# overwriting any the client sent; the shadow collector refuses a copy without a valid one.
MIRROR_AUTH_HEADER = "x-fleetctl-mirror-auth"
MIRROR_AUTH_RE = re.compile(r"^[0-9]{1,19}\.[0-9a-f]{64}$")
# The prompt-size header's value when the gateway could not read the body (too large, not
# JSON, no prompt in it) and the caller stated none: tier routing treats it as the most
# restrictive tier.
PROMPT_TOKENS_UNKNOWN = "unknown"


@dataclass(frozen=True)
class PromptCalibration:
    """How a pool's tokenizer counts a prompt, for a gateway's estimate of its size:
    tokens ~ base + per_message x messages + bytes of text / chars_per_token (the text as
    the JSON body carries it). fleetctl/conformance/calibration.py fits it from the conformance
    probe's usage.prompt_tokens; `source` says where the numbers came from."""

    chars_per_token: float = 4.0
    per_message: float = 5.0
    base: float = 6.0
    source: str = "default"


@dataclass(frozen=True)
class PoolTarget:
    """One upstream pool as a gateway sees it."""

    name: str  # unique, [a-z0-9-], also the cluster/backend name
    base_urls: tuple[str, ...]  # http(s)://host:port[/prefix]
    jurisdiction: str
    prompt: PromptCalibration = PromptCalibration()
    # The pool's latency class ("" unknown): a `failover-class` tier falls over only between
    # pools of the same one.
    latency_class: str = ""
    # Requests one endpoint serves at once, for a `queue` tier's slots; None: the gateway
    # kind's default (Envoy: names.QUEUE_SLOTS_PER_ENDPOINT). No registry field holds it yet.
    slots: int | None = None


@dataclass(frozen=True)
class TierSpec:
    """One context tier of a route as a gateway routes it: the prompts of more than `above`
    and at most `bound` tokens (None: every prompt above `above`), the pools that may serve
    them (computed by fleetctl/traffic/tiers.py, already inside the route's pin), and the
    tier's behaviour when none can (ContextTier.Behaviour)."""

    bound: int | None
    above: int
    behaviour: str
    pools: tuple[str, ...]
    # `queue` only: requests held waiting for a slot, and the Retry-After (seconds) of the
    # 429 a full queue answers with (ContextTier.queue_max, retry_after_s).
    queue_max: int | None = None
    retry_after_s: int | None = None

    @property
    def label(self) -> str:
        return (f"<= {self.bound} tokens" if self.bound is not None
                else f"above {self.above} tokens")


@dataclass(frozen=True)
class PrefixAffinity:
    """A route's prefix affinity as a gateway enforces it: requests with the same key go to
    the same endpoint of the pool their split picked (consistent hashing, bounded load). The
    key is the caller's DesiredState.prefix_key_header when it sends one; else, for
    `prompt`, a hash of the leading `prefix_bytes` of the prompt's text (`header`: none, and
    the request is balanced like any other)."""

    source: str  # "header" | "prompt"
    prefix_bytes: int  # prompt: bytes of text hashed; 0 for header

    @property
    def header(self) -> str:
        """The internal header the gateway writes the key into, one per kind of key."""
        return f"x-fleetctl-affinity-{'p' + str(self.prefix_bytes) if self.prefix_bytes else 'k'}"


def tier_weights(route: RouteSpec, tier: TierSpec) -> dict[str, int]:
    """The route's split restricted to the tier's pools, in basis points summing to
    TOTAL_WEIGHT: a tier only narrows the route's pools (which are already residency-checked),
    never widens them, and never gives weight to a pool the split gives none (a drained pool
    stays drained in every tier). Every pool of the tier the route lists is kept (at 0 when
    the split gives it none, so a ramp stays a weights-only change). Empty: no pool of the
    route may serve the tier, or none of those it may has weight — the tier's behaviour
    answers (413 for reject, 503 otherwise)."""
    pools = sorted(p for p in tier.pools if p in route.weights)
    serving = {p: route.weights[p] for p in pools if route.weights[p] > 0}
    if not serving:
        return {}
    total = sum(serving.values())
    shares = {p: serving.get(p, 0) * TOTAL_WEIGHT // total for p in pools}
    shares[max(serving, key=lambda p: (shares[p], p))] += TOTAL_WEIGHT - sum(shares.values())
    return shares


@dataclass(frozen=True)
class RouteSpec:
    """One route at one revision."""

    key: str  # stable, [a-z0-9-]: the route's name
    model: str  # the `model` of the OpenAI request body
    latency_class: str  # "" = any latency class
    residency: str  # "" = not pinned; else a jurisdiction code the request must carry
    revision: int
    weights: dict[str, int]  # pool name -> basis points; empty = answer an error
    # Share of the route's requests copied to DesiredState.mirror_url, in basis points (a
    # shadow run); 0 = none. Never > 0 on a route with empty weights (selectors).
    mirror_bp: int = 0
    # MIRROR_AUTH_HEADER's value on this gateway's copies of the route (selectors, per
    # gateway); "" = the copies carry none (a client's is removed) and the collector refuses
    # them. A secret: kept out of repr, so no log line or error message prints it.
    mirror_auth: str = field(default="", repr=False)
    # The route's context tiers, smallest bound first (the open-ended one last); () = none.
    # Only kinds with `supports_context_tiers` route by them (renderable() says so for others).
    tiers: tuple[TierSpec, ...] = ()
    # Prefix affinity; None = off. Only kinds with `supports_prefix_affinity` hold it.
    affinity: PrefixAffinity | None = None

    def __post_init__(self) -> None:
        if self.weights and sum(self.weights.values()) != TOTAL_WEIGHT:
            raise ValueError(f"route {self.key}: weights sum to {sum(self.weights.values())}")
        if not 0 <= self.mirror_bp <= TOTAL_WEIGHT:
            raise ValueError(f"route {self.key}: mirror_bp {self.mirror_bp} is not "
                             f"0..{TOTAL_WEIGHT}")
        # Checked here, once, for every renderer: it goes into configs verbatim (quoted).
        if self.mirror_auth and not MIRROR_AUTH_RE.match(self.mirror_auth):
            raise ValueError(f"route {self.key}: mirror_auth is not <gateway id>.<64 hex>")


@dataclass(frozen=True)
class DesiredState:
    """Everything one gateway should hold."""

    routes: tuple[RouteSpec, ...]
    pools: dict[str, PoolTarget]
    model_header: str = "x-fleetctl-model"  # set by the gateway from the body (Envoy) or sent
    residency_header: str = "x-fleetctl-residency"
    latency_class_header: str = "x-fleetctl-latency-class"
    # Set by the gateway (Envoy) from the body: the prompt's estimated tokens, or
    # PROMPT_TOKENS_UNKNOWN; a client's value is removed. A caller states its own count in
    # the stated header; the gateway keeps the larger of the two (docs/traffic.md).
    prompt_tokens_header: str = "x-fleetctl-prompt-tokens"
    prompt_tokens_stated_header: str = "x-fleetctl-prompt-tokens-stated"
    # The caller's prefix key for prefix affinity (docs/traffic.md, "Prefix affinity").
    prefix_key_header: str = "x-fleetctl-prefix-key"
    # Where mirrored requests go (the shadow collector, http://host:port); "" = no mirroring
    # is rendered at all. Each copy carries MIRROR_HEADER: <route key>.
    mirror_url: str = ""

    def held_weights(self) -> dict[str, dict[str, int]]:
        """What read_back() should return once this state is applied (zero weights dropped)."""
        return {r.key: {p: w for p, w in r.weights.items() if w > 0} for r in self.routes}

    def held_mirror(self) -> dict[str, int]:
        """What read_back_mirror() should return once this state is applied: route key ->
        mirror basis points, for the routes that mirror (none without a mirror_url)."""
        if not self.mirror_url:
            return {}
        return {r.key: r.mirror_bp for r in self.routes if r.mirror_bp > 0 and r.weights}


@dataclass(frozen=True)
class GatewaySpec:
    """The Gateway row, as an adapter needs it."""

    name: str
    kind: str
    admin_address: str  # how the gateway is reached: its kind's AddressRule says what it holds
    options: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolCounters:
    requests_total: int  # requests completed or started towards the pool, since start
    errors_total: int  # 5xx answers and connection failures
    active: int  # in flight now


ENDED_BY_CLIENT, ENDED_BY_POOL = "client", "pool"  # LogRecord.ended_by


@dataclass(frozen=True, slots=True)
class LogRecord:
    """One request as a gateway's access log tells it (each kind renders its log format and
    parses its own lines: `<kind>/accesslog.py`); the telemetry ingester turns these into
    per-(route, pool) windows. Times in milliseconds; `ttft_ms` is the time to the first byte
    of the upstream's body (a TTFT for a streamed answer), None when the gateway cannot tell."""

    start: float  # epoch seconds when the request started
    route: str  # the route's name ("" when no route matched)
    pool: str  # the pool that answered ("" when none was chosen)
    status: int  # the status sent downstream; 0 when no answer was sent
    duration_ms: float
    ttft_ms: float | None
    bytes_out: int
    attempts: int  # upstream attempts (1 + retries)
    streamed: bool  # the answer was text/event-stream
    flags: str = ""  # the gateway's response flags ("-" or "" for none)
    # Who cut the request short, as the kind's log tells it (each parser says how):
    # ENDED_BY_CLIENT when the client went away first (a hang-up: counted apart, never
    # against the pool), ENDED_BY_POOL when the pool failed after it had begun answering
    # (the pool's error whatever the status says); "" when the status tells it all.
    ended_by: str = ""
    # The pool the route's split chose when another pool answered (a tier's per-request
    # fallback: the chosen one failed before any byte reached it); "" otherwise.
    fallback_from: str = ""
    # The context tier whose entry routed it: "0", "1", ... or PROMPT_TOKENS_UNKNOWN; "" when
    # none did (a route without tiers, a kind that does not route by prompt size).
    tier: str = ""


@dataclass
class ApplyResult:
    applied: bool
    detail: str = ""  # e.g. "reload used (~100 ms)"; shown in the push attempt record
    method: str = ""  # e.g. "runtime", "file-swap", "reload", "api"
    # What was left out because this gateway cannot route to it (also in `detail`); the
    # gateway's last_error shows it while the rest is held.
    warning: str = ""


@dataclass(frozen=True)
class Renderable:
    """The part of a desired state a gateway kind can hold, and what it leaves out."""

    desired: DesiredState
    left_out: dict[str, str]  # pool -> why this kind cannot route to it
    # What else was left out, said whole (e.g. "HAProxy cannot mirror; ...").
    notes: tuple[str, ...] = ()

    @property
    def warning(self) -> str:
        return "; ".join([f"pool {pool} left out: this gateway {why}"
                          for pool, why in sorted(self.left_out.items())] + list(self.notes))


class AdapterError(Exception):
    """A push that failed. permanent=True means retrying cannot help (bad config, 4xx)."""

    def __init__(self, message: str, *, permanent: bool = False) -> None:
        super().__init__(message)
        self.permanent = permanent


class _KindLabel:
    """`Adapter.label`: the label its kind declares (registry), e.g. "Envoy"."""

    def __get__(self, instance: object, owner: type[Adapter[Any]]) -> str:
        from fleetctl.traffic.gateways import registry

        kind = registry.find(owner.kind)
        return kind.label if kind is not None else owner.kind


OptionsT = TypeVar("OptionsT")


class Adapter(ABC, Generic[OptionsT]):
    """Subclass per gateway kind; override only what differs. Every method is synchronous,
    must time out (use fleetctl.core.http or explicit timeouts) and must never leave the
    gateway half-configured: validate first, keep the previous state on failure.

    `self.options` is the gateway's options as its kind's schema (options.py) reads them:
    typed and checked before the adapter exists (an OptionsError otherwise)."""

    kind: ClassVar[str]  # the value stored in Gateway.kind
    label = _KindLabel()
    # Weights a gateway can represent exactly; others are rounded (e.g. HAProxy: 0..256).
    weight_resolution: ClassVar[str] = "0.01 %"
    # Can this kind copy a share of a route's requests to the shadow collector (mirror_bp)?
    # A kind that cannot renders no mirror and its apply says so (a shadow run then replays).
    supports_mirror: ClassVar[bool] = True
    # Can this kind route a route's requests by prompt size (RouteSpec.tiers)? Saving tiers on
    # a route that a gateway of another kind carries is refused (services.route_tiers_set).
    supports_context_tiers: ClassVar[bool] = False
    # Can this kind send requests sharing a prefix key to one endpoint of a pool
    # (RouteSpec.affinity)? Refused like tiers on a route another kind carries.
    supports_prefix_affinity: ClassVar[bool] = False

    def __init__(self, gateway: GatewaySpec) -> None:
        from fleetctl.traffic.gateways import registry

        self.gateway = gateway
        self.options: OptionsT = registry.get(self.kind).parse_options(gateway.options)

    @classmethod
    def check_pool(cls, pool: PoolTarget) -> str | None:
        """Why gateways of this kind cannot route to `pool` (its name, its base URLs), worded
        to follow "the gateway" ("cannot route to …: do …"), or None. It depends on the pool
        and the kind alone: the registry asks it before storing a pool, and every apply
        leaves out the pools it refuses instead of refusing the whole state."""
        return None

    def renderable(self, desired: DesiredState) -> Renderable:
        return renderable(type(self), desired)

    def apply(self, desired: DesiredState) -> ApplyResult:
        """Make the gateway hold `desired`, less the pools it cannot route to (see
        `renderable`): one bad pool never blocks the rest, and a drain, which only removes
        weight, always applies. What was left out is the result's warning."""
        fit = self.renderable(desired)
        result = self.apply_checked(fit.desired)
        if fit.warning:
            result.warning = fit.warning
            result.detail = "; ".join(text for text in (result.detail,
                                                        f"warning: {fit.warning}") if text)
        return result

    @abstractmethod
    def apply_checked(self, desired: DesiredState) -> ApplyResult:
        """Make the gateway hold `desired`, whose every pool passed check_pool; new requests
        follow it from the moment this returns (or raise AdapterError)."""

    @abstractmethod
    def read_back(self) -> dict[str, dict[str, int]]:
        """Route key -> {pool name: weight in basis points > 0} that the gateway holds now."""

    def read_back_mirror(self) -> dict[str, int] | None:
        """Route key -> mirror basis points (> 0) the gateway holds now, read from the
        gateway; None when this kind cannot read it back (a push then verifies the weights
        alone and its attempt says so). Called right after read_back()."""
        return None

    def mirror_matches(self, desired: DesiredState) -> tuple[bool, str]:
        """Does the gateway hold the mirror fractions of what it can hold of `desired`?
        (True, a note saying so) when this kind cannot read them back. Call it right after
        read_back(): adapters may answer from that read."""
        wanted = self.renderable(desired).desired.held_mirror()
        held = self.read_back_mirror()
        if held is None:
            return True, (f"mirror fraction not verified: {self.label} gateways cannot read it "
                          f"back" if wanted else "")
        if held == wanted:
            return True, ""
        return False, f"mirror fractions read back {held} differ from {wanted} (basis points)"

    @abstractmethod
    def in_flight(self, pool: str) -> int:
        """Requests (including open streams) this gateway has in flight to `pool`."""

    def pool_counters(self) -> dict[str, PoolCounters]:
        """Cumulative per-pool counters from the gateway's own stats, for request and error
        rates per pool. Gateways that cannot tell return {} (the dashboard says so)."""
        return {}

    def matches(self, desired: DesiredState, held: dict[str, dict[str, int]]) -> bool:
        """Does what the gateway holds equal what it can hold of `desired`? Adapters that
        round weights override."""
        return held == self.renderable(desired).desired.held_weights()


_fit_lock = threading.Lock()
_last_fit: dict[type[Adapter[Any]], tuple[DesiredState, Renderable]] = {}


def renderable(kind: type[Adapter[Any]], desired: DesiredState) -> Renderable:
    """`desired` less the pools `kind` cannot route to. A left-out pool's weight counts as
    0: its share goes to the route's other pools that have weight, in proportion (never to
    a pool at 0, which may not be cleared for live traffic), and a route left with none
    answers an error, as an empty split does. Nothing left out: `desired` itself, so the
    render caches keyed on it still hit. Remembered per kind for the last desired state (a
    push hands every gateway the same object; apply and matches both ask)."""
    with _fit_lock:
        last = _last_fit.get(kind)
    if last is not None and last[0] is desired:
        return last[1]
    left_out = {name: why for name, pool in desired.pools.items()
                if (why := kind.check_pool(pool)) is not None}
    fit_desired = _without_pools(desired, set(left_out)) if left_out else desired
    notes: tuple[str, ...] = ()
    if not kind.supports_mirror and desired.mirror_url:
        mirrored = sorted(r.key for r in desired.routes if r.mirror_bp > 0)
        if mirrored:
            notes = (f"{_kind_label(kind)} cannot mirror; route(s) {', '.join(mirrored)} "
                     f"are not mirrored here (use a replay shadow run)",)
            fit_desired = replace(fit_desired, routes=tuple(
                replace(r, mirror_bp=0) if r.mirror_bp else r for r in fit_desired.routes))
    if not kind.supports_context_tiers:
        tiered = sorted(r.key for r in fit_desired.routes if r.tiers)
        if tiered:
            notes += (f"{_kind_label(kind)} cannot route by context tier; route(s) "
                      f"{', '.join(tiered)} follow their split whatever the prompt size",)
            fit_desired = replace(fit_desired, routes=tuple(
                replace(r, tiers=()) if r.tiers else r for r in fit_desired.routes))
    if not kind.supports_prefix_affinity:
        hashed = sorted(r.key for r in fit_desired.routes if r.affinity)
        if hashed:
            notes += (f"{_kind_label(kind)} cannot keep prefix affinity; route(s) "
                      f"{', '.join(hashed)} are balanced by load here",)
            fit_desired = replace(fit_desired, routes=tuple(
                replace(r, affinity=None) if r.affinity else r for r in fit_desired.routes))
    fit = Renderable(desired=fit_desired, left_out=left_out, notes=notes)
    with _fit_lock:
        _last_fit[kind] = (desired, fit)
    return fit


def _kind_label(kind: type[Adapter[Any]]) -> str:
    label = kind.label
    return label if isinstance(label, str) else kind.kind


def _without_pools(desired: DesiredState, gone: set[str]) -> DesiredState:
    routes = tuple(replace(route, weights=_weights_without(route.weights, gone))
                   if gone & set(route.weights) else route for route in desired.routes)
    pools = {name: pool for name, pool in desired.pools.items() if name not in gone}
    return replace(desired, routes=routes, pools=pools)


def _weights_without(weights: dict[str, int], gone: set[str]) -> dict[str, int]:
    kept = {pool: weight for pool, weight in weights.items() if pool not in gone}
    serving = {pool: weight for pool, weight in kept.items() if weight > 0}
    if not serving:
        return {}
    total = sum(serving.values())
    shares = {pool: weight * TOTAL_WEIGHT // total for pool, weight in serving.items()}
    # Integer division leaves a few points over; the largest share takes them.
    shares[max(shares, key=lambda pool: (shares[pool], pool))] += TOTAL_WEIGHT - sum(
        shares.values())
    return kept | shares


ROOT_PATHS = ("", "/", "/v1", "/v1/")


def base_url_problem(url: str, *, schemes: tuple[str, ...] = ("http", "https")) -> str | None:
    """Why a gateway that forwards the client's path unchanged cannot route to `url`, worded
    like check_pool, or None. Such a gateway sends `/v1/chat/completions` to the server as
    the client sent it, so a base URL is the server's root; `/v1` (how OpenAI clients write
    it) means the same root. Any other path would be silently dropped, so it is refused."""
    parts = urlsplit(url)
    if parts.scheme not in schemes or not parts.hostname:
        wanted = " or ".join(f"{scheme}://host:port" for scheme in schemes)
        return f"cannot route to {url!r}: it proxies to {wanted} only"
    if parts.path not in ROOT_PATHS:
        return (f"cannot route to a base URL with a path ({parts.path}): give the server's "
                "root URL (requests keep their /v1/... path)")
    if parts.query or parts.fragment:
        return f"cannot route to {url!r}: a base URL takes no query or fragment"
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        return f"cannot route to {url!r}: its port is not a number from 1 to 65535"
    return None


def run_config_check(argv: Callable[[Path], list[str]], candidate: Path, text: str, *,
                     what: str) -> subprocess.CompletedProcess[str]:
    """Check a rendered config with the gateway's own binary before it replaces the live one:
    `text` is written to `candidate` (beside the live file, so relative paths resolve alike),
    `argv(candidate)` runs on it, and the file is removed. Returns the run for the kind to word
    a refusal; a check that cannot run at all (`what`: e.g. "haproxy -c") is a transient
    AdapterError."""
    candidate.write_text(text)
    try:
        return subprocess.run(argv(candidate), capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AdapterError(f"could not run {what}: {exc}") from exc
    finally:
        candidate.unlink(missing_ok=True)


def pool_base_url_problem(pool: PoolTarget, *,
                          schemes: tuple[str, ...] = ("http", "https")) -> str | None:
    """The first of the pool's base URLs such a gateway cannot route to, said as
    base_url_problem says it, or None."""
    for url in pool.base_urls:
        problem = base_url_problem(url, schemes=schemes)
        if problem:
            return problem
    return None


def url_port(url: str, default: int) -> int:
    """The port of a pool's base URL (`default` when it names none); a bad one is a
    permanent error, since retrying cannot fix a configuration."""
    from urllib.parse import urlsplit

    try:
        port = urlsplit(url).port
    except ValueError as exc:  # out of range or not a number
        raise AdapterError(f"{url!r}: {exc}", permanent=True) from exc
    if port == 0:
        raise AdapterError(f"{url!r}: port 0", permanent=True)
    return default if port is None else port


def address_host(hostname: str) -> str:
    """A base URL's host as a `host:port` address writes it: an IPv6 address in brackets."""
    return f"[{hostname}]" if ":" in hostname else hostname


def openai_error(message: str, kind: str, code: str) -> dict[str, Any]:
    """The OpenAI error object a gateway answers with by itself (every kind's refusals)."""
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


SAFE_NAME = re.compile(r"^[a-z0-9-]+$")
SAFE_VALUE = re.compile(r"^[A-Za-z0-9._:/@+-]+$")


def check_plain_names(desired: DesiredState, *, where: str) -> None:
    """Header names, route keys and matched values that a rendered config can hold without
    quoting; anything else is refused before a byte is written (`where` names the syntax)."""
    for header in (desired.model_header, desired.residency_header,
                   desired.latency_class_header):
        if not SAFE_NAME.match(header):
            raise AdapterError(f"header name {header!r} is not [a-z0-9-]", permanent=True)
    for route in desired.routes:
        if not SAFE_NAME.match(route.key):
            raise AdapterError(f"route key {route.key!r} is not [a-z0-9-]", permanent=True)
        for value in (route.model, route.residency, route.latency_class):
            if value and not SAFE_VALUE.match(value):
                raise AdapterError(f"route {route.key}: {value!r} has characters {where} "
                                   "would need quoting for", permanent=True)


def adapter_for(gateway: GatewaySpec) -> Adapter[Any]:
    """The adapter for a Gateway row (see registry.adapter_for)."""
    from fleetctl.traffic.gateways import registry

    return registry.adapter_for(gateway)


def adapter_class(kind: str) -> type[Adapter[Any]]:
    """The adapter class of a kind (see registry); a permanent AdapterError if unknown."""
    from fleetctl.traffic.gateways import registry

    return registry.adapter_class(kind)
