"""Can the gateways route to a pool? Asked by the registry before it stores a pool.

Checked against every gateway, not only those that carry the pool's routes today: which
routes a pool may carry changes with edits that never touch the pool (a model added to it, a
route added to a gateway), and none of those asks again. A gateway added later, or a pool
stored before this check existed, is still safe: an apply leaves out a pool its gateway
cannot route to and says so (adapters.base.Adapter.apply), so one bad pool never blocks a
gateway's other routes or a drain.
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError

from fleetctl.fleet.models import slug_validator, validate_base_urls
from fleetctl.traffic.gateways.base import AdapterError, PoolTarget, adapter_class
from fleetctl.traffic.models import Gateway


def pool_routable_check(*, name: str, base_urls: Any) -> None:
    """Refuse (400, on `base_urls`) a pool that a registered gateway could not route to,
    naming the gateways and what they cannot do. A name or base URLs the registry itself
    refuses are left to its own validation, which words that better."""
    try:
        slug_validator(name)
        validate_base_urls(base_urls)
    except ValidationError:
        return
    pool = PoolTarget(name=name, base_urls=tuple(base_urls), jurisdiction="")
    gateways: dict[str, list[str]] = {}
    for gateway, kind in Gateway.objects.order_by("name").values_list("name", "kind"):
        gateways.setdefault(kind, []).append(gateway)
    problems = []
    for kind, names in sorted(gateways.items()):
        try:
            adapter = adapter_class(kind)
        except AdapterError:
            continue  # a kind with no adapter is refused when it is pushed, not here
        problem = adapter.check_pool(pool)
        if problem:
            problems.append(f"{_gateways(names)} ({adapter.label or kind}) {problem}.")
    if problems:
        raise ValidationError({"base_urls": problems})


def _gateways(names: list[str]) -> str:
    shown = ", ".join(names[:5])
    more = f" and {len(names) - 5} more" if len(names) > 5 else ""
    return f"Gateway {shown}" if len(names) == 1 else f"Gateways {shown}{more}"
