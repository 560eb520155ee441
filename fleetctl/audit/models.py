"""The audit log: append-only. The model refuses updates and deletes, and database triggers
(see the migration) refuse them too, so not even raw SQL from the app can rewrite history."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.db import models
from django.utils import timezone


class AuditImmutableError(Exception):
    pass


class AuditEventQuerySet(models.QuerySet["AuditEvent"]):
    def update(self, **kwargs: Any) -> int:
        raise AuditImmutableError("Audit events are append-only; they cannot be updated.")

    def delete(self) -> tuple[int, dict[str, int]]:
        raise AuditImmutableError("Audit events are append-only; they cannot be deleted.")


class AuditEvent(models.Model):
    class Outcome(models.TextChoices):
        OK = "ok", "ok"
        DENIED = "denied", "denied"
        FAILED = "failed", "failed"

    at = models.DateTimeField(default=timezone.now, db_index=True)
    # Actor references are kept without a database constraint: deleting a person must not
    # touch (or be blocked by) the history of what they did. `actor` is the readable label.
    actor = models.CharField(max_length=150, db_index=True)
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.DO_NOTHING, db_constraint=False,
        null=True, blank=True, related_name="+",
    )
    token_prefix = models.CharField(max_length=16, blank=True)
    action = models.CharField(max_length=100, db_index=True)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, default=Outcome.OK)
    object_type = models.CharField(max_length=100, blank=True, db_index=True)
    object_id = models.CharField(max_length=64, blank=True)
    object_repr = models.CharField(max_length=200, blank=True)
    before = models.JSONField(null=True, blank=True)
    after = models.JSONField(null=True, blank=True)
    message = models.TextField(blank=True)
    request_id = models.CharField(max_length=64, blank=True, db_index=True)

    objects = AuditEventQuerySet.as_manager()

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["object_type", "object_id", "-at"])]

    def __str__(self) -> str:
        return f"{self.at:%Y-%m-%d %H:%M:%S} {self.actor} {self.action} {self.object_repr}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.pk is not None:
            raise AuditImmutableError("Audit events are append-only; they cannot be updated.")
        super().save(*args, **kwargs)

    def delete(self, *args: Any, **kwargs: Any) -> tuple[int, dict[str, int]]:
        raise AuditImmutableError("Audit events are append-only; they cannot be deleted.")
