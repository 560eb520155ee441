"""Evidence links a person will click: only http(s) URLs with a host or paths on this site are
stored, and a row stored before that rule (or by a path around it) renders as plain text."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from fleetctl.accounts.services import token_create_service
from fleetctl.core.links import is_safe_link
from fleetctl.core.templatetags.links import safe_url
from migrations_plan import services
from migrations_plan.models import Evidence

pytestmark = pytest.mark.django_db

UNSAFE = [
    "javascript:window.__xss=1",
    "JavaScript:alert(1)",
    " javascript:alert(1)",
    "java\tscript:alert(1)",
    "java\nscript:alert(1)",
    "data:text/html,<script>alert(1)</script>",
    "vbscript:msgbox(1)",
    "//evil.example/steal",
    "/\\evil.example/steal",
    "https:evil.example",
    "http://",
    "ftp://ci.example/run/7",
    "runs/7",
]
SAFE = ["https://ci.example/runs/7", "http://10.0.0.5:8080/report?id=7#top",
        "/bench/runs/3/", "/traffic/routes/llama/"]


@pytest.mark.parametrize("url", UNSAFE)
def test_a_script_or_foreign_scheme_url_is_not_a_link(url):
    assert not is_safe_link(url)
    assert safe_url(url) == ""


@pytest.mark.parametrize("url", SAFE)
def test_http_urls_and_site_paths_are_links(url):
    assert is_safe_link(url)
    assert safe_url(url) == url


def evidence_bot(system) -> APIClient:
    issued = token_create_service(actor=system, name="evidence-bot", scopes=["read", "jobs"])
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {issued.secret}")
    return client


@pytest.mark.parametrize("url", UNSAFE)
def test_evidence_with_an_unsafe_url_is_refused_naming_the_field_and_stores_nothing(
    world, system, url
):
    response = evidence_bot(system).post("/api/v1/evidence/", {
        "pool": "mi300x-us", "kind": "external", "reported_by": "ci", "about": "conformance",
        "verdict": "pass", "summary": "ok", "url": url}, format="json")
    assert response.status_code == 400, response.json()
    body = response.json()["error"]
    assert "url" in body["fields"]
    assert "give an http:// or https:// URL with a host, or a path on this site" in (
        body["message"])
    assert not Evidence.objects.exists()


@pytest.mark.parametrize("url", [*SAFE, ""])
def test_evidence_with_an_http_url_or_a_site_path_is_recorded(world, system, url):
    response = evidence_bot(system).post("/api/v1/evidence/", {
        "pool": "mi300x-us", "kind": "external", "reported_by": "ci", "about": "conformance",
        "verdict": "pass", "summary": "ok", "url": url}, format="json")
    assert response.status_code == 201, response.json()
    assert Evidence.objects.get().url == url


def test_an_old_row_with_a_script_url_renders_as_plain_text_on_the_plan_page(world, system):
    plan = world.plan()
    services.evidence_record(actor=system, pool=world.candidate, kind="conformance",
                             verdict="pass", summary="42 of 42 probes pass")
    # As if stored before the validator existed: .update() skips full_clean.
    Evidence.objects.filter(pool=world.candidate).update(url="javascript:window.__xss=1")
    client = Client()
    client.force_login(world.lead)
    page = client.get(f"/plans/{plan.name}/").content.decode()
    assert "42 of 42 probes pass" in page
    assert "javascript:" not in page
