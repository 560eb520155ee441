from __future__ import annotations

from collections.abc import Iterable

from django.db.models import OuterRef, QuerySet, Subquery

from fleetctl.webhooks.models import Delivery, Webhook


def webhook_list() -> QuerySet[Webhook]:
    return Webhook.objects.all()


def webhook_get(*, name: str) -> Webhook | None:
    return Webhook.objects.filter(name=name).first()


def deliveries_for(*, webhook: Webhook) -> QuerySet[Delivery]:
    return webhook.deliveries.prefetch_related("attempt_rows")


def deliveries_latest(*, webhooks: Iterable[Webhook]) -> dict[int, Delivery]:
    """Each webhook's newest delivery, by webhook id, in one query. Portable on purpose: the
    newest per webhook is a correlated subquery, not PostgreSQL's DISTINCT ON, which SQLite
    (the demo's database) does not have."""
    newest = (Delivery.objects.filter(webhook=OuterRef("pk")).order_by("-created_at", "-id")
              .values("pk")[:1])
    ids = (Webhook.objects.filter(pk__in=[hook.pk for hook in webhooks])
           .annotate(newest=Subquery(newest)).values("newest"))
    return {delivery.webhook_id: delivery for delivery in Delivery.objects.filter(pk__in=ids)}
