"""Adding a gateway kind is one folder: tests/traffic/fake_kind/ (options, renderer, adapter,
and the KIND declaration) named in FLEETCTL_GATEWAY_KINDS, and nothing else. It then shows in
the form's and the API's choices, its options are checked by its schema, and the push engine
pushes to it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.forms import modelform_factory

from fleetctl.fleet.services import pool_health_record, pool_model_create
from fleetctl.traffic import push, selectors, services
from fleetctl.traffic.gateways import registry
from fleetctl.traffic.gateways.base import adapter_for
from fleetctl.traffic.models import Gateway, GatewayPush, Route
from tests.conftest import SYSTEM

pytestmark = pytest.mark.django_db
MODEL = "llama-3.1-8b-instruct"


@pytest.fixture(autouse=True)
def file_kind(settings):
    settings.FLEETCTL_GATEWAY_KINDS = ["tests.traffic.fake_kind"]


def test_the_kind_is_not_known_without_the_setting(settings) -> None:
    settings.FLEETCTL_GATEWAY_KINDS = []
    assert "file" not in registry.kinds()
    assert list(registry.kinds()) == ["envoy", "envoy-xds", "gateway-api", "haproxy", "nginx"]


def test_the_kind_is_a_choice_of_the_form_and_the_api(client_for) -> None:
    form = modelform_factory(Gateway, fields=["name", "kind", "admin_address", "options"])()
    assert ("file", "File") in list(form.fields["kind"].choices)
    schema = client_for("viewer").get("/api/schema/?format=json").json()
    assert "file" in schema["components"]["schemas"]["GatewayKindEnum"]["enum"]
    options_help = schema["components"]["schemas"]["Gateway"]["properties"]["options"]
    assert "file_name (a string, required)" in options_help["description"]


@pytest.mark.parametrize(("options", "message"), [
    ({}, "options.file_name is required"),
    ({"file_name": "w.json", "indent": "2"}, "options.indent must be a whole number, not \"2\""),
    ({"file_name": "w.json", "indent": 9}, "options.indent must be from 0 to 8, not 9"),
    ({"file_name": "w.json", "colour": "red"}, "options.colour is not an option of File "
                                               "gateways; theirs are file_name, indent"),
])
def test_its_options_are_checked_by_its_schema(client_for, tmp_path: Path, options,
                                                message) -> None:
    lead = client_for("platform-lead")
    response = lead.post("/api/v1/gateways/", {
        "name": "files", "kind": "file", "admin_address": str(tmp_path), "options": options},
        format="json")
    assert response.status_code == 400
    assert message in " ".join(response.json()["error"]["fields"]["options"])
    answer = lead.post("/api/v1/gateways/", {
        "name": "files", "kind": "file", "admin_address": "relative/dir",
        "options": {"file_name": "w.json"}}, format="json")
    assert answer.status_code == 400
    assert answer.json()["error"]["fields"]["admin_address"] == [
        "File gateways are reached at the directory it keeps its file in, an absolute "
        "directory path: 'relative/dir' is not an absolute path."]


def test_the_push_engine_pushes_to_it(client_for, make_pool, tmp_path: Path,
                                      django_capture_on_commit_callbacks) -> None:
    pool = make_pool(name="a", base_urls=["http://127.0.0.1:7401"])
    pool_model_create(actor=SYSTEM, pool=pool, model_id=MODEL, max_context_tokens=4096)
    pool_health_record(pool_id=pool.pk, ok=True, status_code=200, latency_ms=1.0)
    services.route_create(actor=SYSTEM, name="chat", model_id=MODEL, primary_pool=pool)
    response = client_for("platform-lead").post("/api/v1/gateways/", {
        "name": "files", "kind": "file", "admin_address": str(tmp_path),
        "options": {"file_name": "weights.json", "indent": 2}}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["kind"] == "file"
    gateway = Gateway.objects.get(name="files")
    assert gateway.get_kind_display() == "File"
    with django_capture_on_commit_callbacks():  # no worker here: the attempt is made below
        services.gateway_set_routes(actor=SYSTEM, gateway=gateway,
                                    routes=list(Route.objects.all()))
    pending = GatewayPush.objects.get(gateway=gateway)

    assert push.push_execute(push_id=pending.pk) == "verified"

    assert json.loads((tmp_path / "weights.json").read_text()) == {"chat": {"a": 10_000}}
    adapter = adapter_for(selectors.gateway_spec(gateway))
    assert adapter.label == "File"
    assert adapter.matches(selectors.gateway_desired_state(gateway=gateway),
                           adapter.read_back())
