"""Rows every app may use: the record of requests sent with an Idempotency-Key."""

from __future__ import annotations

from django.db import models
from django.utils import timezone


class IdempotentRequest(models.Model):
    """A POST that changes traffic, sent with an `Idempotency-Key` header: the first one is
    carried out and its answer kept here; a retry with the same key (same caller, same method,
    path and body) gets that answer again instead of a second change. The same key with
    another body is refused (422); while the first is still running, a retry gets 409.
    Kept IDEMPOTENCY_TTL_HOURS (core/idempotency.py)."""

    class State(models.TextChoices):
        RUNNING = "running", "running"
        DONE = "done", "done"

    # Who sent it: "token:<id>" or "user:<id>" — a key is scoped to its caller.
    principal = models.CharField(max_length=64)
    key = models.CharField(max_length=255)
    method = models.CharField(max_length=8)
    path = models.CharField(max_length=500)
    request_sha256 = models.CharField(max_length=64)
    state = models.CharField(max_length=8, choices=State.choices, default=State.RUNNING)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    response = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["principal", "key"], name="one_request_per_key"),
        ]
        indexes = [models.Index(fields=["created_at"])]

    def __str__(self) -> str:
        return f"{self.principal} {self.key}: {self.state}"
