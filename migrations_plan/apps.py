from django.apps import AppConfig


class MigrationsPlanConfig(AppConfig):
    """Staged migration plans: gates, checks, evidence rules, approvals and stage moves."""

    name = "migrations_plan"
    label = "migrations_plan"
    verbose_name = "Migration plans"

    def ready(self) -> None:
        from fleetctl.traffic.policy import register_live_weight_guard
        from migrations_plan.rules import register_builtin
        from migrations_plan.selectors import live_weight_batch_guard, live_weight_guard

        register_builtin()
        register_live_weight_guard(live_weight_guard, batch=live_weight_batch_guard)
