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


def test_the_schema_builds_without_a_warning_and_validates(tmp_path):
    """No two components share a name (one would silently take the other's place), no enum
    gets a hash-suffixed name, and the document is valid OpenAPI 3."""
    from django.core.management import call_command

    call_command("spectacular", "--fail-on-warn", "--validate",
                 "--file", str(tmp_path / "schema.yaml"))


def _schema(client_for) -> dict:
    response = client_for("viewer").get("/api/schema/",
                                        HTTP_ACCEPT="application/vnd.oai.openapi+json")
    return response.json()


def _operations(schema: dict):
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            if method in ("get", "post", "put", "patch", "delete"):
                yield path, method, operation


def test_every_operation_takes_a_token_and_documents_its_errors_in_the_one_error_shape(
        client_for):
    schema = _schema(client_for)
    # Swagger UI's Authorize sends the token as `Authorization: Bearer …`.
    assert schema["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http", "scheme": "bearer",
        "description": "An API token (fct_…) from the Tokens page or /api/v1/tokens/."}
    assert schema["components"]["securitySchemes"]["cookieAuth"]["in"] == "cookie"
    for path, method, operation in _operations(schema):
        assert {"bearerAuth": []} in operation["security"], (method, path)
        assert {"cookieAuth": []} in operation["security"], (method, path)
    error = schema["components"]["schemas"]["Error"]
    assert error["required"] == ["error"]
    assert error["properties"]["error"]["required"] == ["code", "message", "fields"]
    ref = {"$ref": "#/components/schemas/Error"}
    for path, method, operation in _operations(schema):
        responses = operation["responses"]
        expected = {"401", "403", "429"}
        if "{" in path:
            expected |= {"400", "404"}
        if method != "get":
            expected |= {"409"}
        if "requestBody" in operation:
            expected |= {"400"}
        assert expected <= set(responses), (method, path, sorted(responses))
        for code in expected:
            assert responses[code]["content"]["application/json"]["schema"] == ref, (
                method, path, code)
        assert "Retry-After" in responses["429"]["headers"]
        # A body is documented once, as JSON (form bodies are accepted too, undocumented).
        if "requestBody" in operation:
            content = operation["requestBody"]["content"]
            assert "application/json" in content or "multipart/form-data" in content
            assert "application/x-www-form-urlencoded" not in content, (method, path)


def test_documented_answers_are_typed_and_the_revision_history_is_a_page(client_for):
    schema = _schema(client_for)
    components = schema["components"]["schemas"]
    history = schema["paths"]["/api/v1/routes/{name}/revisions/"]["get"]
    assert set(history["responses"]) >= {"200"} and "201" not in history["responses"]
    assert history["responses"]["200"]["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PaginatedRevisionList"}
    # The route list's filters are not the history's.
    assert {p["name"] for p in history["parameters"]} == {"name", "page", "page_size"}
    route = components["Route"]["properties"]
    assert route["current"]["allOf"] == [{"$ref": "#/components/schemas/Revision"}]
    assert route["current"]["nullable"] is True
    assert components["Revision"]["properties"]["weights"] == {
        "type": "object", "additionalProperties": {"type": "number"}, "readOnly": True,
        "description": "Pool name → percent."}
    drain = components["Drain"]["properties"]
    assert drain["gateways"]["items"] == {"$ref": "#/components/schemas/DrainGateway"}
    assert drain["route_revisions"]["items"] == {"$ref": "#/components/schemas/RouteRevision"}
    assert drain["revisions"]["items"] == {"type": "string"}
    assert drain["drained_pools"]["items"] == {"type": "string"}
    assert components["Token"]["properties"]["scopes"]["items"] == {"type": "string"}

    def untyped(name: str, node: dict, where: str) -> list[str]:
        found = []
        for key, prop in node.get("properties", {}).items():
            if not ({"type", "$ref", "allOf", "oneOf", "anyOf"} & set(prop)):
                found.append(f"{name}.{where}{key}")
            found += untyped(name, prop, f"{where}{key}.")
        if isinstance(node.get("items"), dict):
            found += untyped(name, node["items"], f"{where}[].")
        return found

    # A rule parameter's default is whatever the parameter is (a number, a string, a list).
    any_value = {"Param.default"}
    problems = [p for name, component in components.items()
                for p in untyped(name, component, "") if p not in any_value]
    assert not problems, problems


def test_an_error_to_a_csv_export_is_the_json_error_it_documents(client_for, api):
    viewer = client_for("viewer")
    for url in ("/api/v1/bench/runs/999/export/?format=csv", "/api/v1/bench/runs/999/export.csv"):
        response = viewer.get(url)
        assert response.status_code == 404, url
        assert response["Content-Type"] == "application/json", url
        assert response.json()["error"]["code"] == "not_found"
        # Refused before the view runs: no credentials, then a token that is not one.
        for authorization, status in (("", 401), ("Bearer fct_not-a-token", 401)):
            api.credentials(**({"HTTP_AUTHORIZATION": authorization} if authorization else {}))
            response = api.get(url)
            assert response.status_code == status, url
            assert response["Content-Type"] == "application/json", (url, response.content)
            assert response.json()["error"]["code"] in ("not_authenticated",
                                                        "authentication_failed")
    schema = viewer.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    answers = schema["paths"]["/api/v1/bench/runs/{id}/export/"]["get"]["responses"]
    assert set(answers["404"]["content"]) == {"application/json"}
