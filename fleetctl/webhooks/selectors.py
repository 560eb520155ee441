from __future__ import annotations

from django.db.models import QuerySet

from fleetctl.webhooks.models import Delivery, Webhook


def webhook_list() -> QuerySet[Webhook]:
    return Webhook.objects.all()


def webhook_get(*, name: str) -> Webhook | None:
    return Webhook.objects.filter(name=name).first()


def deliveries_for(*, webhook: Webhook) -> QuerySet[Delivery]:
    return webhook.deliveries.prefetch_related("attempt_rows")
