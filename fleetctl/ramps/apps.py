from typing import Any

from django.apps import AppConfig


class RampsConfig(AppConfig):
    """Guarded ramps: a route's weight for one pool stepped up by a controller that checks
    the pool's live telemetry against the SLO and the primary at each hold, and advances,
    pauses or drains by itself; `ramp-slo` evidence."""

    name = "fleetctl.ramps"
    label = "ramps"
    verbose_name = "Ramps"

    def ready(self) -> None:
        from fleetctl.core.panels import Panel, register_panel, register_provider
        from fleetctl.ramps.evidence import register
        from fleetctl.ramps.templatetags.ramps import live_pools
        from fleetctl.traffic.holds import holder_register

        register()
        # The pool page's live block, the route page's live table and Ramps panel, and the
        # overview's live column (fleet and traffic sit below ramps and telemetry).
        register_panel(Panel("pool.panels", "ramps/_pool_live.html", order=10))
        register_panel(Panel("route.panels", "ramps/_route_panels.html", order=10))
        register_provider("fleet.pool_live", live_pools)
        # Which running or paused ramps read each metric source (its page and its delete).
        register_provider("prometheus.source_readers", _metric_source_readers)
        # A drain of a ramp's pool ends the ramp; a restore does not give its share back.
        holder_register("ramps", lock=_lock_for_drain, holds=_holds, drained=_drained)
        # A pool that reports a change nobody registered (an upgrade): its ramps hold.
        from fleetctl.fleet.hooks import register_change_hook, register_report_hook

        register_report_hook(_hold_for_reverification)
        # A registry edit of the pool's fingerprint (runtime, driver, a model's revision...):
        # its ramps hold too, until it is re-verified (conformance/reverify.py).
        register_change_hook(_hold_for_registered_change)


def _metric_source_readers() -> dict[str, list[tuple[str, str]]]:
    """Metric source name -> (text, url) of each running or paused ramp whose guard reads it."""
    from django.urls import reverse

    from fleetctl.ramps.models import ACTIVE_STATES, Ramp

    found: dict[str, list[tuple[str, str]]] = {}
    ramps = (Ramp.objects.select_related("pool", "route").filter(state__in=ACTIVE_STATES)
             .order_by("id"))
    for ramp in ramps:
        names = {c.get("source") for c in ramp.metric_checks or [] if isinstance(c, dict)}
        for name in sorted(n for n in names if isinstance(n, str)):
            found.setdefault(name, []).append((
                f"ramp {ramp.pk} ({ramp.pool.name} on {ramp.route.name}, {ramp.state})",
                reverse("ramps:detail", args=[ramp.pk])))
    return found


def _hold_for_reverification(pool_id: int, changes: list[str]) -> None:
    from fleetctl.ramps.services import ramps_hold_for_report

    ramps_hold_for_report(pool_id=pool_id, changes=changes)


def _hold_for_registered_change(pool_id: int, changes: list[str]) -> None:
    from django.core.exceptions import ValidationError

    from fleetctl.accounts.actor import Actor
    from fleetctl.core.errors import DomainError
    from fleetctl.ramps.models import Ramp
    from fleetctl.ramps.services import ramp_pause

    for ramp in Ramp.objects.filter(pool_id=pool_id, state=Ramp.State.RUNNING).order_by("pk"):
        try:
            ramp_pause(actor=Actor.for_system("reverify"), ramp=ramp,
                       reason=f"the pool changed: {'; '.join(changes)}: held until it is "
                              f"re-verified"[:2000])
        except (ValidationError, DomainError):  # ended or paused meanwhile
            continue


def _lock_for_drain(**kwargs: Any) -> None:
    from fleetctl.ramps.services import ramps_lock_for_drain

    ramps_lock_for_drain(**kwargs)


def _holds(**kwargs: Any) -> Any:
    from fleetctl.ramps.selectors import ramp_holds

    return ramp_holds(**kwargs)


def _drained(**kwargs: Any) -> None:
    from fleetctl.ramps.services import ramps_end_for_drain

    ramps_end_for_drain(**kwargs)
