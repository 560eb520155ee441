from rest_framework import serializers

from fleetctl.accounts import roles
from fleetctl.accounts.models import ApiToken


class TokenSerializer(serializers.ModelSerializer):
    owner = serializers.SerializerMethodField()
    scopes = serializers.ListField(child=serializers.CharField(), read_only=True,
                                   help_text=f"Any of: {', '.join(roles.SCOPES)}.")

    class Meta:
        model = ApiToken
        fields = ["id", "kind", "name", "owner", "scopes", "prefix", "created_at", "expires_at",
                  "revoked_at", "last_used_at"]
        read_only_fields = fields

    def get_owner(self, token: ApiToken) -> str | None:
        return token.user.get_username() if token.user else None


class TokenCreateSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=roles.SCOPES), min_length=1,
        help_text=f"Any of: {', '.join(roles.SCOPES)}.",
        error_messages={"min_length": f"Pick at least one scope of: {', '.join(roles.SCOPES)}."},
    )
    expires_at = serializers.DateTimeField(required=False, allow_null=True)


class TokenIssuedSerializer(TokenSerializer):
    secret = serializers.CharField(
        read_only=True, help_text="Shown once. Only a hash is stored; copy it now."
    )

    class Meta(TokenSerializer.Meta):
        fields = [*TokenSerializer.Meta.fields, "secret"]
        read_only_fields = fields


class MeSerializer(serializers.Serializer):
    username = serializers.CharField()
    roles = serializers.ListField(child=serializers.CharField())
    permissions = serializers.ListField(child=serializers.CharField())
    token = TokenSerializer(allow_null=True)
