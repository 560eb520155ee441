"""A query value a list cannot read is a 400 naming the parameter and what it takes, on every
list endpoint the router has: an unknown enum value, a yes/no that is neither, an id or number
that is not one, a date that is not one, a sort field that does not exist, a page size or
page number out of range. Never ignored (which answers everything, as if unfiltered)."""

from __future__ import annotations

from typing import Any

import pytest
from django import forms
from rest_framework.viewsets import GenericViewSet

from fleetctl.api_urls import router
from fleetctl.core.api.filters import FilterBackend, OrderingFilter

pytestmark = pytest.mark.django_db


def _list_endpoints() -> list[tuple[str, type[GenericViewSet]]]:
    return [(prefix, viewset) for prefix, viewset, _ in router.registry
            if issubclass(viewset, GenericViewSet) and hasattr(viewset, "list")]


def _bad_value(field: forms.Field) -> str | None:
    """A value this filter's field cannot read (None: it reads any text)."""
    if isinstance(field, forms.ModelChoiceField | forms.ModelMultipleChoiceField):
        return "not-an-id"
    if isinstance(field, forms.ChoiceField):
        return "bogus-value"
    if isinstance(field, forms.NullBooleanField):
        return "maybe"
    if isinstance(field, forms.DecimalField | forms.IntegerField | forms.FloatField):
        return "abc"
    if isinstance(field, forms.DateTimeField | forms.DateField):
        return "not-a-date"
    return None


def _filter_cases() -> list[Any]:
    cases = []
    for prefix, viewset in _list_endpoints():
        filterset = FilterBackend().get_filterset_class(viewset(), viewset.queryset)
        for name, declared in (filterset.base_filters.items() if filterset else ()):
            bad = _bad_value(declared.field)
            if bad is None:
                continue
            cases.append(pytest.param(prefix, name, bad, id=f"{prefix}?{name}"))
    return cases


def _paginated() -> list[Any]:
    return [pytest.param(prefix, id=prefix) for prefix, viewset in _list_endpoints()
            if viewset.pagination_class is not None]


def _sortable() -> list[Any]:
    return [pytest.param(prefix, id=prefix) for prefix, viewset in _list_endpoints()
            if OrderingFilter in viewset.filter_backends]


@pytest.fixture
def admin(client_for):
    return client_for("admin")


def _refused(response: Any, parameter: str) -> str:
    assert response.status_code == 400, (response.status_code, response.content[:300])
    error = response.json()["error"]
    assert error["code"] == "invalid" and parameter in error["fields"], error
    assert error["message"].startswith(f"{parameter}: "), error
    return str(error["message"])


def test_every_list_endpoint_is_walked():
    """The walk below covers the router (a new list endpoint is in it without a test
    change); the API's filter backends are the strict ones."""
    assert len(_list_endpoints()) >= 25
    assert FilterBackend in _list_endpoints()[0][1].filter_backends
    assert len(_filter_cases()) >= 40 and len(_paginated()) >= 25


@pytest.mark.parametrize(("prefix", "parameter", "bad"), _filter_cases())
def test_a_filter_value_the_list_cannot_read_is_a_400_naming_the_parameter(
        admin, prefix, parameter, bad):
    message = _refused(admin.get(f"/api/v1/{prefix}/", {parameter: bad}), parameter)
    assert message.startswith(f"{parameter}: “{bad}” is not a valid {parameter}"), message


@pytest.mark.parametrize("prefix", _paginated())
@pytest.mark.parametrize("page_size", ["-128", "0", "501", "ten", "1.5"])
def test_a_page_size_out_of_range_is_a_400_naming_the_allowed_range(admin, prefix, page_size):
    message = _refused(admin.get(f"/api/v1/{prefix}/", {"page_size": page_size}),
                       "page_size")
    assert "allowed: a whole number from 1 to 500 (default 50)" in message


@pytest.mark.parametrize("prefix", _paginated())
def test_a_page_number_that_is_not_one_is_a_400(admin, prefix):
    _refused(admin.get(f"/api/v1/{prefix}/", {"page": "abc"}), "page")


@pytest.mark.parametrize("prefix", _sortable())
def test_sorting_by_a_field_the_list_does_not_offer_is_a_400_listing_those_it_does(
        admin, prefix):
    message = _refused(admin.get(f"/api/v1/{prefix}/", {"ordering": "-no_such_field"}),
                       "ordering")
    assert message.startswith("ordering: Cannot sort by -no_such_field; allowed: ")


def test_an_unknown_enum_value_lists_the_allowed_ones(admin):
    message = _refused(admin.get("/api/v1/pools/", {"runtime": "cuda12"}), "runtime")

    assert message == ("runtime: “cuda12” is not a valid runtime; allowed: cuda, rocm, tpu, "
                       "gaudi, other.")


def test_a_yes_no_filter_refuses_what_is_neither_and_reads_true_and_false(admin, make_pool):
    from fleetctl.fleet.services import pool_health_record

    pool = make_pool(name="h200")
    pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)

    assert _refused(admin.get("/api/v1/health-checks/", {"ok": "yes please"}), "ok") == (
        "ok: “yes please” is not a valid ok; allowed: true, false.")
    assert admin.get("/api/v1/health-checks/", {"ok": "true"}).json()["count"] == 1
    assert admin.get("/api/v1/health-checks/", {"ok": "false"}).json()["count"] == 0


def test_valid_values_still_filter_sort_and_page(admin, make_pool):
    for name in ("a", "b", "c"):
        make_pool(name=name)

    answer = admin.get("/api/v1/pools/", {"runtime": "cuda", "ordering": "-name",
                                          "page_size": "2", "page": "last"})

    assert answer.status_code == 200
    assert [p["name"] for p in answer.json()["results"]] == ["a"]
    assert admin.get("/api/v1/pools/", {"page": "9"}).status_code == 404


def test_no_list_filters_on_a_parameter_drf_reads_itself() -> None:
    """DRF reads ?format= (which renderer answers) before any filter sees it: a filter of
    that name could never work."""
    for prefix, viewset in _list_endpoints():
        filterset = FilterBackend().get_filterset_class(viewset(), viewset.queryset)
        assert "format" not in (filterset.base_filters if filterset else {}), prefix
