"""The project's URLs plus one API view that checks a permission when asked for its
queryset, as a view may: building the schema must not run that check as the caller."""

from __future__ import annotations

from django.db.models import QuerySet
from django.urls import include, path
from rest_framework import routers, serializers, viewsets

from fleetctl.accounts import roles
from fleetctl.accounts.permissions import actor_from_request
from fleetctl.audit.models import AuditEvent
from fleetctl.urls import urlpatterns as project_urls


class GuardedSerializer(serializers.ModelSerializer):
    class Meta:
        model = AuditEvent
        fields = ["id", "action"]


class GuardedViewSet(viewsets.ReadOnlyModelViewSet):
    serializer_class = GuardedSerializer

    def get_queryset(self) -> QuerySet[AuditEvent]:
        actor_from_request(self.request).require(roles.ADMIN_MANAGE, action="guarded.list")
        return AuditEvent.objects.all()


router = routers.SimpleRouter()
router.register("guarded", GuardedViewSet, basename="guarded")

urlpatterns = [path("api/v1/", include(router.urls)), *project_urls]
