import pytest

pytestmark = pytest.mark.django_db


def test_the_openapi_schema_describes_the_api(client_for):
    viewer = client_for("viewer")
    response = viewer.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    for path in ("/api/v1/pools/", "/api/v1/regions/", "/api/v1/pool-models/",
                 "/api/v1/health-checks/", "/api/v1/audit-events/", "/api/v1/tokens/"):
        assert path in schema["paths"], path


def test_the_docs_page_serves_its_assets_locally(client_for):
    viewer = client_for("viewer")
    response = viewer.get("/api/docs/")
    assert response.status_code == 200
    html = response.content.decode()
    # No CDN: this product runs where only the gateway can reach the internet.
    assert "cdn.jsdelivr" not in html and "unpkg" not in html
    assert "/static/drf_spectacular_sidecar/" in html


def test_responses_carry_a_request_id_and_keep_a_plain_one_from_the_caller(client_for):
    viewer = client_for("viewer")
    assert len(viewer.get("/api/v1/pools/")["X-Request-ID"]) == 32
    assert viewer.get("/api/v1/pools/", HTTP_X_REQUEST_ID="ci-42")["X-Request-ID"] == "ci-42"
    assert viewer.get("/api/v1/pools/", HTTP_X_REQUEST_ID="bad id;")["X-Request-ID"] != "bad id;"
