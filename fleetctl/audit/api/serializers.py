from rest_framework import serializers

from fleetctl.audit.models import AuditEvent


class AuditEventSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = [
            "id", "at", "actor", "token_prefix", "action", "outcome", "object_type",
            "object_id", "object_repr", "before", "after", "message", "request_id",
        ]
        read_only_fields = fields
