"""Where the layers above fleet hear of a pool's changes, without fleet knowing them: each
list is filled by an app's `ready()` (conformance re-verifies, ramps hold, traffic drains by
its health policy) and run after the change committed; one hook's trouble never stops the
others."""

from __future__ import annotations

import logging
from collections.abc import Callable

log = logging.getLogger("fleetctl.fleet.services")

# Called with (pool_id, changes) once a probe found the pool reporting something new of
# itself (an upgraded server version, another max_model_len) and it committed. Upper layers
# register here: conformance re-probes every open plan's candidate, ramps hold.
ReportHook = Callable[[int, list[str]], object]
REPORT_HOOKS: list[ReportHook] = []


def _hook_added(hooks: list[ReportHook], hook: ReportHook) -> ReportHook:
    if hook not in hooks:
        hooks.append(hook)
    return hook


def _hooks_run(hooks: list[ReportHook], what: str, pool_id: int, changes: list[str]) -> None:
    for hook in list(hooks):
        try:
            hook(pool_id, changes)
        except Exception:  # one layer's trouble must not stop the others
            log.exception("%s hook %s failed for pool %s", what, hook, pool_id)


def register_report_hook(hook: ReportHook) -> ReportHook:
    return _hook_added(REPORT_HOOKS, hook)


def _report_hooks_run(pool_id: int, changes: list[str]) -> None:
    _hooks_run(REPORT_HOOKS, "report", pool_id, changes)


# Called with (pool_id, changes) once a registry edit that changes what the pool is (the
# fields of the evidence fingerprint: runtime version, driver label, a model's revision,
# quantisation or weight format) committed. Upper layers register here: conformance
# re-verifies the pool (conformance/reverify.py) and its ramps hold, as for a reported change.
ChangeHook = Callable[[int, list[str]], object]
CHANGE_HOOKS: list[ChangeHook] = []


def register_change_hook(hook: ChangeHook) -> ChangeHook:
    return _hook_added(CHANGE_HOOKS, hook)


# Called with (pool_id, transition_id) once a flip of a pool's health has committed. Upper
# layers register here (traffic's health policy drains and restores) so that fleet needs no
# knowledge of routes.
HealthHook = Callable[[int, int], None]
HEALTH_HOOKS: list[HealthHook] = []


def register_health_hook(hook: HealthHook) -> HealthHook:
    if hook not in HEALTH_HOOKS:
        HEALTH_HOOKS.append(hook)
    return hook


def _health_hooks_run(pool_id: int, transition_id: int) -> None:
    for hook in HEALTH_HOOKS:
        try:
            hook(pool_id, transition_id)
        except Exception:  # the flip is recorded; one hook must not stop others
            log.exception("health hook %s failed for transition %s", hook, transition_id)


def _change_hooks_run(pool_id: int, changes: list[str]) -> None:
    _hooks_run(CHANGE_HOOKS, "change", pool_id, changes)


# Called with a sentence saying what changed ("EUR→USD 1.08 as of 2026-12-01 added") once a
# currency-rate edit committed. Upper layers that convert with the rates register here: the
# business case re-judges the plans that have one (fleetctl/economics/).
RateHook = Callable[[str], object]
RATE_HOOKS: list[RateHook] = []


def register_rate_hook(hook: RateHook) -> RateHook:
    if hook not in RATE_HOOKS:
        RATE_HOOKS.append(hook)
    return hook


def _rate_hooks_run(what: str) -> None:
    for hook in list(RATE_HOOKS):
        try:
            hook(what)
        except Exception:  # the rate is stored; one hook must not stop others
            log.exception("rate hook %s failed for %s", hook, what)


# Called with (pool_id, what) once something that prices the pool's hours otherwise than its
# rate committed: its reclaim model or standby (an edit), or a newer drill that measures its
# interruption tax (fleet/interruption.py). Figures apply the tax when read; upper layers
# that store a judgement of the cost register here (the business case, the soak's cost
# arbitrage) and judge it again.
TaxHook = Callable[[int, str], object]
TAX_HOOKS: list[TaxHook] = []


def register_tax_hook(hook: TaxHook) -> TaxHook:
    if hook not in TAX_HOOKS:
        TAX_HOOKS.append(hook)
    return hook


def tax_hooks_run(pool_id: int, what: str) -> None:
    for hook in list(TAX_HOOKS):
        try:
            hook(pool_id, what)
        except Exception:  # the change is stored; one hook must not stop others
            log.exception("tax hook %s failed for pool %s", hook, pool_id)
