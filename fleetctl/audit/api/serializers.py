from rest_framework import serializers

from fleetctl.audit.models import AuditEvent
from fleetctl.core.api.schema import NullableObjectField


class AuditEventSerializer(serializers.ModelSerializer):
    before = NullableObjectField(read_only=True, help_text="What changed, as it was.")
    after = NullableObjectField(read_only=True, help_text="What changed, as it is now.")

    class Meta:
        model = AuditEvent
        fields = [
            "id", "at", "actor", "token_prefix", "action", "outcome", "object_type",
            "object_id", "object_repr", "before", "after", "message", "request_id",
        ]
        read_only_fields = fields
