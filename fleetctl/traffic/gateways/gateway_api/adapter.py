"""Kubernetes Gateway API adapter: one HTTPRoute (gateway.networking.k8s.io/v1) per route,
written by server-side apply, read back from the API server.

`GatewaySpec.admin_address` is the API server URL; options.py lists the options (namespace,
parent Gateway, each pool's Service or InferencePool, token, CA, status checks). render.py
says how routes match and how residency fails closed.

What "applied" means here: the API server stored the objects. The Gateway implementation then
takes them asynchronously. What "held" means (read_back()): each of fleetctl's HTTPRoutes —
routes and guard — has, for the parentRef fleetctl rendered, a `status.parents[]` entry (of
`controller_name`'s controller when that option is set, else of every controller that wrote
one for that parentRef) whose `Accepted` condition is "True" with `observedGeneration` >=
`metadata.generation`, and no `Accepted` or `ResolvedRefs` condition "False" for that
generation. ResolvedRefs is how a backendRef to an InferencePool that does not exist (or that
the implementation does not support) shows: the Gateway implementation sets it False
(reason BackendNotFound or InvalidKind), and the push fails for good naming it. A controller
takes a moment to observe a new generation, so read_back() re-reads for up to
`status_wait_s` while the only problem is lag (a refusal ends the wait at once) — otherwise
nearly every push's first attempt would fail and turn the gateway red for a retry. After
that it raises AdapterError naming the route and why: retryable while the controller has
not yet observed the generation (no entry, older or missing `observedGeneration`, `Accepted`
"Unknown"); permanent when it observed it and refused it (the condition, reason and message
are in the error). `require_status: false` skips the check, for
implementations that write no status. Status says the controller accepted the route, not that
every data-plane replica has it: read_back() reads the API objects, not the data plane.
In-flight requests are not observable through the API: in_flight() returns -1, and a drain on
this kind is verified by read-back only.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from fleetctl.core.http import (
    Client,
    OutboundCertificateError,
    OutboundError,
    OutboundResponse,
    OutboundTimeout,
)
from fleetctl.traffic.gateways.base import (
    Adapter,
    AdapterError,
    ApplyResult,
    DesiredState,
    GatewaySpec,
    Renderable,
)
from fleetctl.traffic.gateways.gateway_api.options import GatewayApiOptions
from fleetctl.traffic.gateways.gateway_api.render import (
    FIELD_MANAGER,
    GATEWAY_LABEL,
    GROUP,
    MANAGED_BY,
    ROLE_LABEL,
    ROUTE_ANNOTATION,
    GatewayApiSettings,
    held_mirror,
    held_weights,
    parent_refs,
    render_routes,
)

STATUS_POLL_S = 0.1  # re-read interval while waiting for the controller (status_wait_s)


# --- status: has the Gateway implementation taken it? ------------------------------------------

@dataclass(frozen=True)
class NotHeld:
    """Why one stored HTTPRoute does not count as held."""

    message: str
    rejected: bool  # the controller observed this generation and refused it


def _same_parent(ref: dict[str, Any], ours: dict[str, Any], route_namespace: str) -> bool:
    """Does a status entry's parentRef name our parentRef? Unset fields take the API's
    defaults (group gateway.networking.k8s.io, kind Gateway, the route's namespace)."""
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        return (r.get("group", GROUP), r.get("kind", "Gateway"),
                r.get("namespace") or route_namespace, r.get("name"),
                r.get("sectionName") or None, r.get("port"))
    return key(ref) == key(ours)


def _observed(condition: dict[str, Any]) -> int:
    """A condition's observedGeneration; -1 when absent (it cannot vouch for any generation)."""
    try:
        return int(condition.get("observedGeneration", -1))
    except (TypeError, ValueError):
        return -1


def _parent_text(ref: dict[str, Any]) -> str:
    text = f"parent {ref.get('kind', 'Gateway')} {ref.get('namespace')}/{ref.get('name')}"
    return text + (f" section {ref['sectionName']}" if ref.get("sectionName") else "")


def status_not_held(item: dict[str, Any], settings: GatewayApiSettings) -> NotHeld | None:
    """None when, for every parentRef fleetctl rendered, the route's status has an entry
    (of `controller_name`'s controller if set, else every entry for that parentRef) with
    Accepted "True" at observedGeneration >= metadata.generation and neither Accepted nor
    ResolvedRefs "False" at that generation; else why not. Entries for other parents, and
    of other controllers when `controller_name` is set, are ignored."""
    meta = item.get("metadata") or {}
    namespace = str(meta.get("namespace") or settings.namespace)
    route = f"{namespace}/{meta.get('name')}"
    try:
        generation = int(meta.get("generation") or 0)
    except (TypeError, ValueError):
        generation = 0
    parents = (item.get("status") or {}).get("parents") or []
    lagging = f"controller has not yet observed generation {generation} of HTTPRoute {route}"
    for ours in parent_refs(settings):
        entries = [entry for entry in parents
                   if _same_parent(entry.get("parentRef") or {}, ours, namespace)
                   and (settings.controller_name is None
                        or entry.get("controllerName") == settings.controller_name)]
        if not entries:
            by = f" by {settings.controller_name}" if settings.controller_name else ""
            return NotHeld(f"{lagging} (no status{by} for {_parent_text(ours)} yet)", False)
        for entry in entries:
            controller = entry.get("controllerName") or "an unnamed controller"
            conditions = {c.get("type"): c for c in entry.get("conditions") or []
                          if isinstance(c, dict)}
            for kind in ("Accepted", "ResolvedRefs"):
                condition = conditions.get(kind)
                if (condition and condition.get("status") == "False"
                        and _observed(condition) >= generation):
                    return NotHeld(
                        f"HTTPRoute {route} generation {generation} refused by {controller} "
                        f"for {_parent_text(ours)}: {kind} is False, reason "
                        f"{condition.get('reason') or '(none)'}: "
                        f"{condition.get('message') or '(no message)'}", True)
            accepted = conditions.get("Accepted")
            if accepted is None or _observed(accepted) < generation:
                seen = ("no Accepted condition" if accepted is None
                        else "Accepted is for generation "
                             f"{accepted.get('observedGeneration', '(unset)')}")
                return NotHeld(f"{lagging} ({controller}, {_parent_text(ours)}: {seen})",
                               False)
            if accepted.get("status") != "True":
                return NotHeld(
                    f"HTTPRoute {route} generation {generation} not yet accepted by "
                    f"{controller} for {_parent_text(ours)}: Accepted is "
                    f"{accepted.get('status')}, reason {accepted.get('reason') or '(none)'}: "
                    f"{accepted.get('message') or '(no message)'}", False)
    return None


# --- the adapter ----------------------------------------------------------------------------------

class GatewayApiAdapter(Adapter[GatewayApiOptions]):
    kind = "gateway-api"
    weight_resolution = "0.01 % (backendRefs weights in basis points)"

    def __init__(self, gateway: GatewaySpec) -> None:
        super().__init__(gateway)
        self.settings = GatewayApiSettings.of(gateway.name, gateway.admin_address, self.options)
        self._guard_held = True
        self._http: Client | None = None
        self._held_mirror: dict[str, int] | None = None

    def renderable(self, desired: DesiredState) -> Renderable:
        """What every kind leaves out, and the mirror when no collector Service is named
        (option shadow_collector_service): a RequestMirror filter needs a backendRef."""
        fit = super().renderable(desired)
        mirrored = sorted(r.key for r in fit.desired.routes if r.mirror_bp > 0)
        if not mirrored or not fit.desired.mirror_url or self.settings.collector is not None:
            return fit
        note = (f"route(s) {', '.join(mirrored)} not mirrored: set the gateway option "
                f"shadow_collector_service (SERVICE:PORT of the shadow collector)")
        routes = tuple(replace(r, mirror_bp=0) for r in fit.desired.routes)
        return Renderable(desired=replace(fit.desired, routes=routes), left_out=fit.left_out,
                          notes=(*fit.notes, note))

    def apply_checked(self, desired: DesiredState) -> ApplyResult:
        started = time.monotonic()
        objects = render_routes(desired, self.settings)
        wanted = {obj["metadata"]["name"] for obj in objects}
        for obj in objects:  # the guard first: fail-closed before any new route exists
            self._apply_one(obj)
        stale = [item["metadata"]["name"] for item in self._list()
                 if item["metadata"]["name"] not in wanted]
        for name in stale:
            self._call("DELETE", f"{self.settings.collection}/{name}", missing_ok=True)
        elapsed_ms = (time.monotonic() - started) * 1000
        return ApplyResult(applied=True, method="api", detail=(
            f"server-side applied {len(objects)} HTTPRoute(s) (1 residency guard), deleted "
            f"{len(stale)} stale, in {elapsed_ms:.0f} ms; the Gateway implementation programs "
            f"its data plane asynchronously"))

    def read_back(self) -> dict[str, dict[str, int]]:
        """The weights of fleetctl's stored HTTPRoutes — once the Gateway implementation has
        accepted their current generation (see the module notes; unless `require_status` is
        false). Until then AdapterError says which route and why: retryable while the
        controller has not observed it, permanent once it refused it."""
        deadline = time.monotonic() + self.settings.status_wait_s
        while True:
            items = self._list()
            if not self.settings.require_status:
                break
            problems = [problem for problem in (status_not_held(item, self.settings)
                                                for item in items) if problem]
            if not problems:
                break
            if any(p.rejected for p in problems) or time.monotonic() >= deadline:
                shown = "; ".join(p.message for p in problems[:3])
                more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
                raise AdapterError(f"{shown}{more}",
                                   permanent=any(p.rejected for p in problems))
            time.sleep(STATUS_POLL_S)
        roles = [item["metadata"].get("labels", {}).get(ROLE_LABEL) for item in items]
        self._guard_held = "residency-guard" in roles
        self._held_mirror = {
            item["metadata"].get("annotations", {}).get(ROUTE_ANNOTATION, ""): bp
            for item, role in zip(items, roles, strict=True)
            if role == "route" and (bp := held_mirror(item)) > 0}
        return {item["metadata"].get("annotations", {}).get(ROUTE_ANNOTATION, ""):
                held_weights(item, self.settings)
                for item, role in zip(items, roles, strict=True) if role == "route"}

    def matches(self, desired: DesiredState, held: dict[str, dict[str, int]]) -> bool:
        """Weights equal, and the residency guard is in place (without it a request naming a
        jurisdiction could reach an unpinned route)."""
        return self._guard_held and super().matches(desired, held)

    def read_back_mirror(self) -> dict[str, int] | None:
        """The RequestMirror shares of the HTTPRoutes read_back() just read (the API
        objects, as for weights: not the data plane)."""
        if self._held_mirror is None:
            self.read_back()
        held, self._held_mirror = self._held_mirror, None
        return held

    def in_flight(self, pool: str) -> int:
        return -1  # not observable through the Gateway API; drains are verified by read-back

    # --- HTTP ---

    def _client(self) -> Client:
        """One client per adapter instance (building the TLS context costs ~10 ms); the token
        is added per request, so a rotated token file takes effect at once."""
        if self._http is None:
            try:
                self._http = Client(base_url=self.settings.api_url,
                                    verify=self.settings.ca_file or True,
                                    timeout_s=self.settings.timeout_s,
                                    headers={"Accept": "application/json"})
            except OutboundCertificateError as exc:
                raise AdapterError(str(exc), permanent=True) from exc
        return self._http

    def _token(self) -> str | None:
        if self.settings.token:
            return self.settings.token
        if self.settings.token_file:
            try:
                return Path(self.settings.token_file).read_text().strip()
            except OSError as exc:
                raise AdapterError(f"cannot read token file {self.settings.token_file}: {exc}",
                                   permanent=True) from exc
        return None

    def _apply_one(self, obj: dict[str, Any]) -> None:
        # JSON is YAML: the API server takes it as an apply patch.
        self._call("PATCH", f"{self.settings.collection}/{obj['metadata']['name']}",
                   params={"fieldManager": FIELD_MANAGER, "force": "true"},
                   content=json.dumps(obj),
                   headers={"Content-Type": "application/apply-patch+yaml"})

    def _list(self) -> list[dict[str, Any]]:
        selector = f"{MANAGED_BY}=fleetctl,{GATEWAY_LABEL}={self.settings.gateway}"
        response = self._call("GET", self.settings.collection, params={"labelSelector": selector})
        try:
            return list(response.json().get("items") or [])
        except (ValueError, AttributeError) as exc:
            raise AdapterError(f"the API server's HTTPRoute list is not JSON: {exc}") from exc

    def _call(self, method: str, path: str, *, missing_ok: bool = False,
              headers: dict[str, str] | None = None, **kwargs: Any) -> OutboundResponse:
        what = f"{method} {self.settings.api_url}{path}"
        headers = dict(headers or {})
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        try:
            response = self._client().request(method, path, headers=headers, **kwargs)
        except OutboundTimeout as exc:
            raise AdapterError(f"{what} timed out after {self.settings.timeout_s:g} s") from exc
        except OutboundCertificateError as exc:
            # A certificate that does not verify is configuration: retrying cannot fix it.
            raise AdapterError(str(exc), permanent=True) from exc
        except OutboundError as exc:
            raise AdapterError(str(exc)) from exc
        status = response.status_code
        if status < 400 or (missing_ok and status == 404):
            return response
        message = _status_message(response)
        # 4xx: the request itself is wrong (auth, validation, RBAC): retrying cannot help,
        # except 408/429, which ask to come back later.
        permanent = status < 500 and status not in (408, 429)
        raise AdapterError(f"{what} answered {status}: {message}", permanent=permanent)


def _status_message(response: OutboundResponse) -> str:
    try:
        return str(response.json().get("message", ""))[:500] or response.reason
    except (ValueError, AttributeError):
        return response.text[:300] or response.reason
