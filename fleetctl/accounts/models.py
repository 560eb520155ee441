from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class ApiToken(models.Model):
    """A bearer token. Only a SHA-256 of the secret is stored; the secret is shown once."""

    class Kind(models.TextChoices):
        PERSONAL = "personal", "personal"
        SERVICE = "service", "service"

    kind = models.CharField(max_length=16, choices=Kind.choices)
    name = models.CharField(max_length=100)
    # Personal tokens act for this user; service tokens record who created them.
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, null=True, blank=True,
        related_name="api_tokens",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True,
        related_name="+",
    )
    scopes = models.JSONField(default=list)
    prefix = models.CharField(max_length=16, help_text="Shown to people to tell tokens apart.")
    secret_sha256 = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.CheckConstraint(
                condition=(
                    models.Q(kind="personal", user__isnull=False)
                    | models.Q(kind="service", user__isnull=True)
                ),
                name="token_kind_matches_owner",
            )
        ]

    def __str__(self) -> str:
        return f"{self.kind} token {self.name} ({self.prefix}…)"

    @property
    def label(self) -> str:
        return f"token:{self.prefix}"

    def is_usable(self, now: object | None = None) -> bool:
        moment = now or timezone.now()
        if self.revoked_at is not None:
            return False
        return self.expires_at is None or self.expires_at > moment  # type: ignore[operator]
