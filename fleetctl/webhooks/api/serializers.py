from __future__ import annotations

from typing import Any

from rest_framework import serializers

from fleetctl.accounts import roles
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.core.api.schema import ObjectField
from fleetctl.webhooks.models import EVENTS, Attempt, Delivery, Webhook


class WebhookSerializer(serializers.ModelSerializer):
    # Write-only: a receiver's secret is never shown back, only whether one is set.
    secret = serializers.CharField(
        write_only=True, required=False, allow_blank=True, max_length=200,
        help_text="Signs each body (X-Fleetctl-Signature: sha256=<HMAC-SHA256 hex>). Never "
                  "returned; send an empty string to remove it.")
    has_secret = serializers.SerializerMethodField(help_text="Whether bodies are signed.")
    # Checked by the service, with the events, so that one answer names every problem.
    url = serializers.CharField(
        max_length=500, help_text="http:// or https:// URL. Shown whole only to those who may "
                                  "manage webhooks; others read scheme, host and port (a "
                                  "receiver's path is often its secret).")
    trusted = serializers.BooleanField(
        required=False, help_text="Keep the receiver's answers (first 500 characters) for "
                                  "readers; otherwise only its status line. Administrators "
                                  "set it; a URL change by anyone else clears it.")
    events = serializers.ListField(
        child=serializers.CharField(max_length=40), required=False,
        help_text="Event names (" + ", ".join(sorted(EVENTS)) + "); empty: every event.")

    class Meta:
        model = Webhook
        fields = ["id", "name", "url", "events", "format", "active", "trusted", "secret",
                  "has_secret", "created_by", "created_at"]
        read_only_fields = ["id", "has_secret", "created_by", "created_at"]
        # The service checks uniqueness and says so the way the rest of the API does.
        extra_kwargs: dict[str, Any] = {"name": {"validators": []}}

    def get_has_secret(self, hook: Webhook) -> bool:
        return bool(hook.secret)

    def to_representation(self, instance: Webhook) -> dict[str, Any]:
        data = super().to_representation(instance)
        request = self.context.get("request")
        if request is None or not actor_from_request(request).can(roles.FLEET_MANAGE):
            data["url"] = instance.url_shown
        return data


class AttemptSerializer(serializers.ModelSerializer):
    class Meta:
        model = Attempt
        fields = ["number", "at", "status_code", "error", "duration_ms", "response_excerpt"]
        read_only_fields = fields


class DeliverySerializer(serializers.ModelSerializer):
    attempt_rows = AttemptSerializer(many=True, read_only=True)
    payload = ObjectField(read_only=True, help_text="`text` (the one line a Slack-format "
                          "webhook is sent) and `data` (the event's body).")

    class Meta:
        model = Delivery
        fields = ["id", "event", "payload", "status", "created_at", "delivered_at", "attempts",
                  "next_attempt_at", "last_error", "attempt_rows"]
        read_only_fields = fields
