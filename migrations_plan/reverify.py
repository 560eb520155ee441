"""Re-verification hooks: what runs after a changed pool's conformance re-run passed.

A pool that changed (its servers report a new version or weights revision, or a registry edit
changes its fingerprint) is re-verified: first a conformance probe (fleetctl/conformance/
reverify.py). When that probe passes for a plan whose candidate the pool is, each hook
registered here starts its own re-run for the plan — evals the plan's last suite, bench its
last benchmark where a route of the plan asks (`reverify_benchmark`). The hooks live here,
below the apps that register them, so that neither conformance nor they import each other.
A hook returns the run it started, or None (and says why on the plan's record itself).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fleetctl.accounts.actor import Actor
    from migrations_plan.models import Plan

log = logging.getLogger(__name__)

ReverifiedHook = Callable[["Plan", "Actor"], Any]
# name (the kind of run: "evals", "benchmarks") -> hook, in registration order.
REVERIFIED_HOOKS: dict[str, ReverifiedHook] = {}


def register_reverified_hook(name: str, hook: ReverifiedHook) -> ReverifiedHook:
    REVERIFIED_HOOKS.setdefault(name, hook)
    return hook


def run_reverified_hooks(plan: Plan, actor: Actor) -> dict[str, list[int]]:
    """Each hook once; {name: [ids of the runs it started]}. One hook's trouble is logged and
    does not stop the others."""
    started: dict[str, list[int]] = {}
    for name, hook in list(REVERIFIED_HOOKS.items()):
        try:
            run = hook(plan, actor)
        except Exception:
            log.exception("re-verification hook %s failed for plan %s", name, plan.name)
            run = None
        started[name] = [run.pk] if run is not None else []
    return started
