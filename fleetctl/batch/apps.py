from typing import Any

from django.apps import AppConfig


class BatchConfig(AppConfig):
    """Batch jobs (stage 3): OpenAI Batch-format inputs run on a pool by worker processes
    that claim chunks by conditional UPDATE and checkpoint every finished request; interruption
    drills, recurring soaks on a plan's candidate and the measured cost arbitrage;
    `soak`, `checkpoint-resume` and `cost-arbitrage` evidence."""

    name = "fleetctl.batch"
    label = "batch"
    verbose_name = "Batch"

    def ready(self) -> None:
        from fleetctl.batch.drill import drill_measures
        from fleetctl.batch.evidence import register
        from fleetctl.batch.soak import cost_rejudge, cost_rejudge_for_pool
        from fleetctl.batch.soak_rule import register as register_soak_rule
        from fleetctl.batch.stage_moves import pause_jobs_the_stage_no_longer_allows
        from fleetctl.core.panels import Panel, register_panel
        from fleetctl.fleet.hooks import register_tax_hook
        from fleetctl.fleet.interruption import register_drill_source
        from migrations_plan.panels import PLAN_PANELS
        from migrations_plan.services import PREDICTION_HOOKS, STAGE_MOVE_HOOKS

        register()
        register_soak_rule()
        register_drill_source(drill_measures)
        register_tax_hook(cost_rejudge_for_pool)
        register_panel(Panel(PLAN_PANELS, "batch/_plan_panel.html", order=30,
                             when=_plan_in_stage_3_or_later))
        if cost_rejudge not in PREDICTION_HOOKS:
            PREDICTION_HOOKS.append(cost_rejudge)
        if pause_jobs_the_stage_no_longer_allows not in STAGE_MOVE_HOOKS:
            STAGE_MOVE_HOOKS.append(pause_jobs_the_stage_no_longer_allows)


def _plan_in_stage_3_or_later(context: Any) -> bool:
    """The plan page's Batch panel shows from stage 3 (batch) on."""
    return context["plan"].stage >= 3
