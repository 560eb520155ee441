from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from fleetctl.audit.models import AuditEvent


@admin.register(AuditEvent)
class AuditEventAdmin(admin.ModelAdmin):
    """Readable in the admin, never editable or deletable there."""

    list_display = ["at", "actor", "action", "outcome", "object_type", "object_repr"]
    list_filter = ["outcome", "object_type"]
    search_fields = ["actor", "action", "object_repr", "request_id"]
    actions = None

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False
