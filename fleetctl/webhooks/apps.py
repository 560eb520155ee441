from django.apps import AppConfig


class WebhooksConfig(AppConfig):
    """Outgoing webhooks: ramp decisions, automatic drains, failing gateways and gate changes,
    delivered by Celery with retries; every delivery and attempt a row."""

    name = "fleetctl.webhooks"
    label = "webhooks"
    verbose_name = "Webhooks"
