from django.apps import AppConfig


class TrafficConfig(AppConfig):
    name = "fleetctl.traffic"
    label = "traffic"
    verbose_name = "Traffic"

    def ready(self) -> None:
        from fleetctl.core.destinations import own_services_register
        from fleetctl.fleet.hooks import register_health_hook
        from fleetctl.fleet.services import register_context_guard
        from fleetctl.traffic.services.tiers import context_lowering_refusal

        register_health_hook(_queue_health_policy)
        register_context_guard(context_lowering_refusal)
        own_services_register("a registered gateway's admin API", _gateway_admin_addresses)


def _gateway_admin_addresses() -> list[str]:
    """Every registered gateway's admin address that is a URL or host:port (a unix socket
    or a directory is reached by no URL): a webhook or pool pointed there would drive the
    gateway's admin API."""
    from fleetctl.traffic.models import Gateway

    return [address for address in Gateway.objects.values_list("admin_address", flat=True)
            if not address.startswith("/")]


def _queue_health_policy(pool_id: int, transition_id: int) -> None:
    """The health policy runs as a task: the probe's worker only records the flip."""
    from fleetctl.traffic.tasks import health_policy

    health_policy.delay(transition_id)
