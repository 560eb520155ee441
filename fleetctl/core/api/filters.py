"""The API's filter backends: a query value a list cannot read is a 400 naming the parameter
and what it takes (core/filters.py), for every list endpoint, whatever FilterSet it names.
settings.REST_FRAMEWORK["DEFAULT_FILTER_BACKENDS"] names these two."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django_filters import rest_framework as rest_filters
from django_filters import utils
from django_filters.rest_framework import DjangoFilterBackend
from rest_framework import exceptions
from rest_framework import filters as drf_filters
from rest_framework.request import Request

from fleetctl.core.filters import StrictFilterSetMixin, strict


class ApiFilterSet(StrictFilterSetMixin, rest_filters.FilterSet):
    """What a view's `filterset_fields` build on: django-filter's REST flavour (ISO 8601
    date-times, true/false), strict."""


class FilterBackend(DjangoFilterBackend):
    """django-filter's backend with the strict FilterSet: `filterset_fields` build on it,
    and a view's own `filterset_class` gets its strictness too."""

    filterset_base = ApiFilterSet
    raise_exception = True

    def get_filterset_class(self, view: Any, queryset: QuerySet[Any] | None = None) -> Any:
        filterset_class = super().get_filterset_class(view, queryset)
        return strict(filterset_class) if filterset_class is not None else None

    def filter_queryset(self, request: Request, queryset: QuerySet[Any], view: Any
                        ) -> QuerySet[Any]:
        filterset = self.get_filterset(request, queryset, view)
        if filterset is None:
            return queryset
        if not filterset.is_valid():
            raise utils.translate_validation(filterset.errors)
        return filterset.qs  # type: ignore[no-any-return]


class OrderingFilter(drf_filters.OrderingFilter):
    """DRF's `?ordering=`, refusing a field it may not sort by (DRF drops it silently)."""

    def get_ordering(self, request: Request, queryset: QuerySet[Any], view: Any
                     ) -> Any:
        raw = request.query_params.get(self.ordering_param)
        if raw:
            asked = [term.strip() for term in raw.split(",") if term.strip()]
            valid = [name for name, _ in self.get_valid_fields(queryset, view,
                                                                {"request": request})]
            bad = [term for term in asked if term.lstrip("-") not in valid]
            if bad:
                raise exceptions.ValidationError({self.ordering_param: [
                    f"Cannot sort by {', '.join(bad)}; allowed: "
                    f"{', '.join(sorted(valid)) or 'nothing'} (prefix - for descending)."]})
        return super().get_ordering(request, queryset, view)
