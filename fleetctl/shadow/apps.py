from django.apps import AppConfig


class ShadowConfig(AppConfig):
    """Shadow runs: live traffic mirrored at the gateway (or replayed from a trace) to the
    primary, the primary again and the candidate; per-pair comparisons; `shadow` evidence."""

    name = "fleetctl.shadow"
    label = "shadow"
    verbose_name = "Shadow"

    def ready(self) -> None:
        from fleetctl.core.panels import Panel, register_panel
        from fleetctl.fleet.hooks import register_change_hook, register_report_hook
        from fleetctl.shadow.evidence import register
        from migrations_plan.panels import PLAN_PANELS, gate_action

        register()
        # A pool that reports an upgrade, or whose registered fingerprint is edited: its
        # running runs are judged at once, so their evidence is on the new fingerprints.
        register_report_hook(_judge_runs_of_pool)
        register_change_hook(_judge_runs_of_pool)
        register_panel(gate_action("shadow/_gate_action.html", ("divergence", 2), order=20))
        register_panel(Panel(PLAN_PANELS, "shadow/_plan_panel.html", order=10))


def _judge_runs_of_pool(pool_id: int, changes: list[str]) -> None:
    from fleetctl.shadow.services import pool_changed

    pool_changed(pool_id, changes)
