import pytest

from fleetctl.traffic.models import Gateway

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("body", "field"), [
    ({"kind": "envoy", "admin_address": "127.0.0.1:9901", "options": {"config_dir": "/x"}},
     "admin_address"),
    ({"kind": "envoy", "admin_address": "http://127.0.0.1:9901", "options": {}}, "options"),
    ({"kind": "envoy", "admin_address": "http://127.0.0.1:9901", "options": [1]}, "options"),
    ({"kind": "squid", "admin_address": "http://x", "options": {}}, "kind"),
    ({"kind": "haproxy", "admin_address": "has space", "options": {}}, "admin_address"),
    ({"kind": "haproxy", "admin_address": "/run/haproxy.sock", "options": {"bind": ":80"}},
     "options"),
    ({"kind": "nginx", "admin_address": "/srv/nginx", "options": {}}, "options"),
])
def test_bad_gateways_are_refused_naming_the_field(client_for, body, field):
    lead = client_for("platform-lead")
    response = lead.post("/api/v1/gateways/", {"name": "gw", **body}, format="json")
    assert response.status_code == 400
    assert field in response.json()["error"]["fields"], response.json()
    assert not Gateway.objects.exists()


def test_only_fleet_managers_register_gateways(client_for):
    oncall = client_for("on-call")
    response = oncall.post("/api/v1/gateways/", {
        "name": "gw", "kind": "envoy", "admin_address": "http://127.0.0.1:9901",
        "options": {"config_dir": "/tmp/x"}}, format="json")
    assert response.status_code == 403
