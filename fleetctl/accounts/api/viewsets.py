"""A ModelViewSet whose writes go through domain services (permission, validation, audit)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth.models import AnonymousUser
from rest_framework import viewsets
from rest_framework.serializers import BaseSerializer

from fleetctl.accounts import selectors
from fleetctl.accounts.permissions import DESCRIBING_API, actor_from_request


def describing_request(method: str, path: str, view: Any, original_request: Any,
                       **kwargs: Any) -> Any:
    """The request every view is given while the API's schema is built (drf-spectacular's
    GET_MOCK_REQUEST). Building the schema instantiates each view and asks it for its
    queryset and serializer class; that is not a request for its data, so the view must not
    check the caller's permissions (a refusal would be audited on every schema download).
    This request carries nobody's identity and is marked, so `actor_from_request` answers
    with the platform describing its own API: no check is made, nothing is audited, no
    action runs. One mechanism for every view, present and future."""
    from drf_spectacular.plumbing import build_mock_request

    request = build_mock_request(method, path, view, None, **kwargs)
    request.user, request.auth = AnonymousUser(), None
    setattr(request, DESCRIBING_API, True)
    return request


class ServiceModelViewSet(viewsets.ModelViewSet):
    """Subclasses name their services; DRF validates the shape, the service does the rest."""

    create_service: Callable[..., Any]
    update_service: Callable[..., Any]
    delete_service: Callable[..., Any]
    instance_kwarg: str = "instance"

    def _actor(self):  # type: ignore[no-untyped-def]
        return actor_from_request(self.request)

    def _as_read(self, instance: Any) -> Any:
        """The written row as a read shows it: the answer to a write has the fields the
        queryset adds (a region's pool_count), as the schema promises."""
        return selectors.row_as_listed(self.get_queryset(), pk=instance.pk)

    def perform_create(self, serializer: BaseSerializer) -> None:
        serializer.instance = self._as_read(type(self).create_service(
            actor=self._actor(), **serializer.validated_data
        ))

    def perform_update(self, serializer: BaseSerializer) -> None:
        serializer.instance = self._as_read(type(self).update_service(
            actor=self._actor(), **{self.instance_kwarg: serializer.instance},
            **serializer.validated_data,
        ))

    def perform_destroy(self, instance: Any) -> None:
        type(self).delete_service(actor=self._actor(), **{self.instance_kwarg: instance})
