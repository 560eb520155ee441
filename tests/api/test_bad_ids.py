"""Ids and names the database cannot take are a clear 4xx in the one error shape, never a
500 with a traceback; answers to writes carry every field the schema promises."""

from __future__ import annotations

import pytest

from fleetctl.bench.models import Run
from fleetctl.traffic.models import Drain

pytestmark = pytest.mark.django_db

@pytest.fixture
def admin(token_client):
    return token_client(["read", "jobs", "ramp", "drain", "fleet"], "admin")


@pytest.mark.parametrize("bad_id", ["abc", "null,null", "1.5"])
@pytest.mark.parametrize(("method", "path"), [
    ("get", "/api/v1/bench/runs/{}/levels/"),
    ("get", "/api/v1/bench/runs/{}/samples/"),
    ("get", "/api/v1/bench/runs/{}/export/"),
    ("post", "/api/v1/bench/runs/{}/cancel/"),
    ("post", "/api/v1/drains/{}/restore/"),
    ("get", "/api/v1/drains/{}/"),
    ("get", "/api/v1/bench/runs/{}/"),
])
def test_a_non_numeric_id_is_a_404_in_the_one_error_shape(admin, method, path, bad_id):
    response = getattr(admin, method)(path.format(bad_id), {"reason": "try"}, format="json")
    assert response.status_code == 404
    error = response.json()["error"]
    # "1.5" matches no URL at all (ids have no dots), the others no object.
    assert error["code"] == "not_found" and error["message"] in (
        "No such object. Check the id or name in the URL.",
        "Nothing at this path: check the id or name in it, and the endpoint against /api/docs/.")
    assert not Run.objects.exists() and not Drain.objects.exists()


@pytest.mark.parametrize("path", ["/api/v1/pools/a%00b/", "/api/v1/regions/a%00b/",
                                  "/api/v1/routes/a%00b/", "/api/v1/plans/a%00b/"])
def test_a_nul_character_in_a_name_is_a_400_not_a_500(admin, path):
    response = admin.get(path)
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith(
        "A value in this request cannot be stored or looked up (for example it contains a NUL "
        "character)")


def test_a_path_no_url_matches_is_a_404_in_the_one_error_shape_under_the_api(admin):
    response = admin.get("/api/v1/no-such-endpoint/")
    assert response.status_code == 404 and response["Content-Type"] == "application/json"
    assert response.json()["error"]["code"] == "not_found"


def test_a_nul_character_in_a_name_looked_up_from_the_body_is_a_400(admin, make_pool):
    make_pool(name="h200")
    response = admin.patch("/api/v1/pools/h200/", {"region": "us\x00east"}, format="json")
    assert response.status_code == 400 and response.json()["error"]["code"] == "invalid"


def test_a_region_write_answers_with_its_pool_count_like_a_read(admin, make_pool):
    created = admin.post("/api/v1/regions/", {"code": "eu-west", "name": "EU West",
                                              "jurisdiction": "EU"}, format="json")
    assert created.status_code == 201 and created.json()["pool_count"] == 0
    make_pool(name="h200")  # in us-east
    renamed = admin.patch("/api/v1/regions/us-east/", {"name": "Virginia"}, format="json")
    assert renamed.status_code == 200 and renamed.json()["pool_count"] == 1
