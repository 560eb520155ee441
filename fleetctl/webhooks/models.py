"""Outgoing webhooks, and every delivery and attempt as a row."""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models
from django.utils import timezone

# The registry's slug rule (fleet.models.slug_validator), spelled here: webhooks sits below
# fleet in the layering (tests/test_layers.py), so anything may notify.
slug_validator = RegexValidator(
    r"^[a-z0-9][a-z0-9-]{0,62}$",
    "Use 1–63 lowercase letters, digits and hyphens, starting with a letter or digit.",
)

# What a webhook may subscribe to (services.notify's `event`).
EVENTS = {
    "ramp.decision": "a ramp's guard advanced, paused or rolled back (and people's actions)",
    "drain.automatic": "a pool was drained (or restored) by the health policy, or drained by "
                       "a route's re-verification policy",
    "gateway.failing": "a gateway failed to take a push, or recovered",
    "gate.changed": "a plan's gate changed status, or the plan changed stage",
    "plan.at_risk": "a gate a plan already passed lost what it was approved on (or got it "
                    "back)",
    "batch.soak": "a batch soak on a plan's candidate passed, failed or was stopped",
    "schedule.missed": "a scheduled run's window passed without a start (beat or workers down)",
    "schedule.failed": "a scheduled run could not be started, or its job failed",
    "watch.failed": "a standing live watch found a pool failing (drained or alerted by "
                    "policy)",
}


class Webhook(models.Model):
    class Format(models.TextChoices):
        JSON = "json", "JSON (fleetctl's event body)"
        SLACK = "slack", "Slack-compatible ({\"text\": ...})"

    name = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    url = models.URLField(max_length=500)
    events = models.JSONField(default=list, help_text="Event names; empty: every event.")
    format = models.CharField(max_length=5, choices=Format.choices, default=Format.JSON)
    # Signs each body (HMAC-SHA256, header X-Fleetctl-Signature); never shown back.
    secret = models.CharField(max_length=200, blank=True)
    active = models.BooleanField(default=True)
    # What the receiver answers is kept (first EXCERPT_CHARS) and shown to every reader only
    # for a receiver an administrator trusts; otherwise its status line alone. Whoever may
    # add a webhook could otherwise read an internal service's answers through it.
    trusted = models.BooleanField(
        default=False, help_text="Keep the receiver's answers for readers (administrators "
                                 "set it; a URL change by anyone else clears it).")
    created_by = models.CharField(max_length=150)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    @property
    def url_shown(self) -> str:
        """The URL as shown to people who cannot manage webhooks: scheme, host and port. A
        receiver's path is often its secret (a Slack URL), and `user:pass@` always is."""
        return url_masked(self.url)


def url_masked(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or "?"
    host = f"[{host}]" if ":" in host else host
    try:
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        port = ""
    rest = "/…" if (parts.path not in ("", "/") or parts.query or parts.username) else "/"
    return f"{parts.scheme}://{host}{port}{rest}"


class Delivery(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "pending"
        RETRYING = "retrying", "retrying"
        DELIVERED = "delivered", "delivered"
        FAILED = "failed", "failed (refused, or out of attempts)"

    webhook = models.ForeignKey(Webhook, on_delete=models.CASCADE, related_name="deliveries")
    event = models.CharField(max_length=40)
    payload = models.JSONField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    created_at = models.DateTimeField(default=timezone.now)
    delivered_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [models.Index(fields=["status", "next_attempt_at"])]

    def __str__(self) -> str:
        return f"{self.event} → {self.webhook_id}: {self.status}"


class Attempt(models.Model):
    delivery = models.ForeignKey(Delivery, on_delete=models.CASCADE, related_name="attempt_rows")
    number = models.PositiveIntegerField()
    at = models.DateTimeField(default=timezone.now)
    status_code = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)
    duration_ms = models.FloatField(null=True, blank=True)
    response_excerpt = models.TextField(blank=True)

    class Meta:
        ordering = ["delivery", "number"]
        constraints = [
            models.UniqueConstraint(fields=["delivery", "number"], name="attempt_numbers_unique"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.number} of delivery {self.delivery_id}"
