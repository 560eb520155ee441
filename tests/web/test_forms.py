"""Registering and changing the fleet through the dashboard forms: the services decide, the
forms show their answers on the right field, and nothing half-valid is written."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.core.exceptions import ValidationError
from django.test import Client
from django.urls import reverse

from fleetctl.audit.models import AuditEvent
from fleetctl.core.views import form_add_service_errors
from fleetctl.fleet.forms import PoolForm
from fleetctl.fleet.models import Pool, PoolModel, Region

pytestmark = pytest.mark.django_db

LoginAs = Callable[[User], Client]


def pool_form(region: Region, /, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "mi300x-fra-b", "runtime": "rocm", "runtime_version": "vLLM 0.6.3",
        "accelerator": "MI300X", "region": region.code,
        "base_urls": "http://10.0.0.5:8000/v1\n\nhttp://10.0.0.6:8000/v1\n",
        "latency_class": "standard", "max_context_tokens": "32768",
        "node_hourly_rate": "6.25", "currency": "USD", "labels": "driver=6.2.4\nrack = r12\n",
    }
    data.update(changes)
    return data


def field_errors(response: Any, field: str) -> list[str]:
    return list(response.context["form"].errors.get(field, []))


def test_a_viewer_posting_the_pool_form_is_refused_with_a_message_and_nothing_is_created(
    login_as: LoginAs, viewer: User, region: Region
):
    response = login_as(viewer).post(reverse("fleet:pool-create"), pool_form(region))
    assert response.status_code == 403
    assert "needs a role that grants it" in response.content.decode()
    assert not Pool.objects.exists()
    denied = AuditEvent.objects.get(action="pool.create", outcome="denied")
    assert denied.actor == viewer.username


def test_a_platform_lead_registers_a_pool_through_the_form(
    login_as: LoginAs, lead: User, region: Region
):
    client = login_as(lead)
    response = client.post(reverse("fleet:pool-create"), pool_form(region))
    assert response.status_code == 302
    assert response["Location"] == reverse("fleet:pool-detail", args=["mi300x-fra-b"])
    pool = Pool.objects.get(name="mi300x-fra-b")
    assert pool.base_urls == ["http://10.0.0.5:8000/v1", "http://10.0.0.6:8000/v1"]
    assert pool.labels == {"driver": "6.2.4", "rack": "r12"}
    assert pool.region == region
    event = AuditEvent.objects.get(action="pool.create", outcome="ok")
    assert event.actor == lead.username and event.object_id == str(pool.pk)
    page = client.get(response["Location"]).content.decode()
    assert "Registered pool mi300x-fra-b." in page


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"base_urls": "ftp://x"}, "base_urls", "only http:// and https://"),
        ({"base_urls": "  \n "}, "base_urls", "at least one base URL"),
        ({"node_hourly_rate": "-1"}, "node_hourly_rate", "greater than or equal to 0"),
        ({"region": "mars-1"}, "region", "no region with that code"),
        ({"name": "x" * 64}, "name", "at most 63 characters"),
        ({"name": "Bad Name"}, "name", "lowercase letters"),
        ({"labels": "driver"}, "labels", "is not key=value"),
        ({"labels": "a=1\na=2"}, "labels", "given twice"),
        ({"max_context_tokens": "12"}, "max_context_tokens", "greater than or equal to 256"),
    ],
)
def test_bad_pool_input_shows_an_error_on_its_field_and_writes_nothing(
    login_as: LoginAs, lead: User, region: Region, changes: dict[str, str], field: str,
    words: str,
):
    response = login_as(lead).post(reverse("fleet:pool-create"), pool_form(region, **changes))
    assert response.status_code == 200
    assert any(words in message for message in field_errors(response, field)), (
        response.context["form"].errors
    )
    assert not Pool.objects.exists()
    assert not AuditEvent.objects.filter(action="pool.create").exists()


def test_every_bad_field_is_reported_after_one_submit(
    login_as: LoginAs, lead: User, region: Region
):
    response = login_as(lead).post(reverse("fleet:pool-create"), pool_form(
        region, name="Bad Name", base_urls="ftp://x", node_hourly_rate="-1", labels="oops",
    ))
    errors = response.context["form"].errors
    assert set(errors) == {"name", "base_urls", "node_hourly_rate", "labels"}
    assert "Nothing was saved" in response.content.decode()
    assert not Pool.objects.exists()


def test_service_errors_land_on_their_field_or_at_the_top_of_the_form():
    form = PoolForm(data={})
    form.is_valid()
    form_add_service_errors(form, ValidationError({
        "name": ["taken"], "cost_per_1m_output_tokens": ["read-only"], "__all__": ["race"],
    }))
    assert "taken" in form.errors["name"]
    assert form.non_field_errors() == ["cost_per_1m_output_tokens: read-only", "race"]
    form_add_service_errors(form, ValidationError("plain message"))
    assert "plain message" in form.non_field_errors()


def test_a_duplicate_pool_name_is_shown_on_the_name_field(
    login_as: LoginAs, lead: User, region: Region, pool: Pool
):
    response = login_as(lead).post(
        reverse("fleet:pool-create"), pool_form(region, name=pool.name)
    )
    assert response.status_code == 200
    assert any("already exists" in message for message in field_errors(response, "name"))
    assert Pool.objects.count() == 1
    assert AuditEvent.objects.filter(action="pool.create").count() == 1  # the fixture's own


def test_editing_a_pool_saves_the_change_and_audits_the_difference(
    login_as: LoginAs, lead: User, pool: Pool
):
    client = login_as(lead)
    form = client.get(reverse("fleet:pool-edit", args=[pool.name])).context["form"]
    data = {name: "" if form[name].value() is None else form[name].value()
            for name in form.fields}  # what a browser sends for an empty field
    data["region"] = pool.region.code
    data.update(node_hourly_rate="11.00", labels="team=serving\ntier=gold")
    response = client.post(reverse("fleet:pool-edit", args=[pool.name]), data)
    assert response.status_code == 302, response.context["form"].errors
    pool.refresh_from_db()
    assert str(pool.node_hourly_rate) == "11.0000"
    assert pool.labels == {"team": "serving", "tier": "gold"}
    event = AuditEvent.objects.get(action="pool.update")
    assert event.after is not None and set(event.after) == {"labels", "node_hourly_rate"}


def test_deleting_a_pool_needs_a_post_and_then_removes_it(
    login_as: LoginAs, lead: User, pool: Pool
):
    client = login_as(lead)
    confirm = client.get(reverse("fleet:pool-delete", args=[pool.name]))
    assert confirm.status_code == 200 and Pool.objects.filter(pk=pool.pk).exists()
    response = client.post(reverse("fleet:pool-delete", args=[pool.name]))
    assert response.status_code == 302 and response["Location"] == reverse("fleet:overview")
    assert not Pool.objects.filter(pk=pool.pk).exists()
    assert AuditEvent.objects.filter(action="pool.delete", outcome="ok").exists()


def test_a_viewer_cannot_delete_a_pool(login_as: LoginAs, viewer: User, pool: Pool):
    response = login_as(viewer).post(reverse("fleet:pool-delete", args=[pool.name]))
    assert response.status_code == 403
    assert Pool.objects.filter(pk=pool.pk).exists()
    assert AuditEvent.objects.filter(action="pool.delete", outcome="denied").exists()


def test_a_lead_adds_and_removes_a_served_model_on_the_pool_page(
    login_as: LoginAs, lead: User, pool: Pool
):
    client = login_as(lead)
    response = client.post(
        reverse("fleet:pool-model-add", args=[pool.name]),
        {"model_id": "mistral-large-2", "quantisation": "int4-awq", "max_context_tokens": "8192"},
    )
    assert response.status_code == 302
    entry = PoolModel.objects.get(pool=pool, model_id="mistral-large-2")
    assert entry.quantisation == "int4-awq"
    response = client.post(reverse("fleet:pool-model-remove", args=[pool.name, entry.pk]))
    assert response.status_code == 302
    assert not PoolModel.objects.filter(pk=entry.pk).exists()
    page = client.get(reverse("fleet:pool-detail", args=[pool.name])).content.decode()
    assert "no longer serves mistral-large-2" in page


def test_a_served_model_longer_than_the_pool_context_is_refused_on_its_field(
    login_as: LoginAs, lead: User, pool: Pool
):
    response = login_as(lead).post(
        reverse("fleet:pool-model-add", args=[pool.name]),
        {"model_id": "big-context", "quantisation": "bf16", "max_context_tokens": "999999"},
    )
    assert response.status_code == 200
    errors = response.context["model_form"].errors
    assert "exceeds the pool's maximum context" in " ".join(errors["max_context_tokens"])
    assert not PoolModel.objects.filter(model_id="big-context").exists()


def test_the_same_model_twice_on_one_pool_is_refused(login_as: LoginAs, lead: User, pool: Pool):
    response = login_as(lead).post(
        reverse("fleet:pool-model-add", args=[pool.name]),
        {"model_id": "llama-3.1-70b-instruct", "quantisation": "bf16",
         "max_context_tokens": "4096"},
    )
    assert response.status_code == 200
    assert "already exists" in response.content.decode()
    assert PoolModel.objects.filter(pool=pool, model_id="llama-3.1-70b-instruct").count() == 1


def test_a_viewer_cannot_remove_a_served_model(login_as: LoginAs, viewer: User, pool: Pool):
    entry = pool.models.first()
    assert entry is not None
    client = login_as(viewer)
    response = client.post(reverse("fleet:pool-model-remove", args=[pool.name, entry.pk]))
    assert response.status_code == 302
    assert PoolModel.objects.filter(pk=entry.pk).exists()
    page = client.get(response["Location"]).content.decode()
    assert "needs a role that grants it" in page


def test_a_lead_creates_a_region_and_a_duplicate_code_is_refused(
    login_as: LoginAs, lead: User
):
    client = login_as(lead)
    data = {"code": "ap-south-1", "name": "Mumbai", "jurisdiction": "IN"}
    response = client.post(reverse("fleet:region-create"), data)
    assert response.status_code == 302
    assert Region.objects.get(code="ap-south-1").jurisdiction == "IN"
    response = client.post(reverse("fleet:region-create"), data)
    assert response.status_code == 200
    assert any("already exists" in m for m in response.context["form"].errors["code"])
    listing = client.get(reverse("fleet:region-list")).content.decode()
    assert "ap-south-1" in listing and "India" in listing


def test_a_viewer_cannot_create_a_region(login_as: LoginAs, viewer: User):
    response = login_as(viewer).post(
        reverse("fleet:region-create"), {"code": "x-1", "name": "X", "jurisdiction": "EU"}
    )
    assert response.status_code == 403
    assert not Region.objects.filter(code="x-1").exists()
