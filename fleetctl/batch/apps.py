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
        from fleetctl.batch.evidence import register
        from fleetctl.batch.soak import cost_rejudge
        from migrations_plan.services import PREDICTION_HOOKS

        register()
        if cost_rejudge not in PREDICTION_HOOKS:
            PREDICTION_HOOKS.append(cost_rejudge)
