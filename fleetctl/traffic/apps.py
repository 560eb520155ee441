from django.apps import AppConfig


class TrafficConfig(AppConfig):
    name = "fleetctl.traffic"
    label = "traffic"
    verbose_name = "Traffic"

    def ready(self) -> None:
        from fleetctl.fleet.services import register_health_hook

        register_health_hook(_queue_health_policy)


def _queue_health_policy(pool_id: int, transition_id: int) -> None:
    """The health policy runs as a task: the probe's worker only records the flip."""
    from fleetctl.traffic.tasks import health_policy

    health_policy.delay(transition_id)
