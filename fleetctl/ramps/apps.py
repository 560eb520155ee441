from django.apps import AppConfig


class RampsConfig(AppConfig):
    """Guarded ramps: a route's weight for one pool stepped up by a controller that checks
    the pool's live telemetry against the SLO and the primary at each hold, and advances,
    pauses or drains by itself; `ramp-slo` evidence."""

    name = "fleetctl.ramps"
    label = "ramps"
    verbose_name = "Ramps"

    def ready(self) -> None:
        from fleetctl.ramps.evidence import register

        register()
