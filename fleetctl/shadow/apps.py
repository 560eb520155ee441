from django.apps import AppConfig


class ShadowConfig(AppConfig):
    """Shadow runs: live traffic mirrored at the gateway (or replayed from a trace) to the
    primary, the primary again and the candidate; per-pair comparisons; `shadow` evidence."""

    name = "fleetctl.shadow"
    label = "shadow"
    verbose_name = "Shadow"

    def ready(self) -> None:
        from fleetctl.shadow.evidence import register

        register()
