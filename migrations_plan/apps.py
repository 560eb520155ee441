from django.apps import AppConfig


class MigrationsPlanConfig(AppConfig):
    """Staged migration plans, gates, checks and approvals (filled by the plans issue)."""

    name = "migrations_plan"
    label = "migrations_plan"
    verbose_name = "Migration plans"
