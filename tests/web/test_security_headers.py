"""Every response says how a browser may treat it: a Content-Security-Policy under which only
script files from this site run (so markup that slipped past escaping still cannot execute),
and the usual headers against sniffing, framing, referrer leaks and cross-window access.
Templates carry no inline script or handler the policy would silently break."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.django_db

TEMPLATES = Path(__file__).resolve().parents[2] / "templates"


def policy(response) -> dict[str, list[str]]:
    header = response.headers.get("Content-Security-Policy", "")
    directives = [part.split() for part in header.split(";") if part.strip()]
    return {words[0]: words[1:] for words in directives}


def test_a_dashboard_page_runs_only_script_files_from_this_site(client_for):
    response = client_for("viewer").get("/")
    assert response.status_code == 200
    csp = policy(response)
    assert csp["script-src"] == ["'self'"]
    assert csp["default-src"] == ["'self'"]
    # An inline <script> or onerror="…" that got through would be refused, and so would eval.
    for directive in ("script-src", "default-src"):
        assert "'unsafe-inline'" not in csp[directive]
        assert "'unsafe-eval'" not in csp[directive]
    assert csp["object-src"] == ["'none'"]
    assert csp["base-uri"] == ["'self'"]
    assert csp["frame-ancestors"] == ["'none'"]
    assert csp["form-action"] == ["'self'"]


@pytest.mark.parametrize("path", ["/login/", "/", "/api/v1/pools/", "/api/docs/"])
def test_every_response_carries_the_usual_security_headers(client_for, path):
    response = client_for("viewer").get(path)
    assert response.status_code == 200
    assert response.headers["X-Content-Type-Options"] == "nosniff"
    assert response.headers["Referrer-Policy"] == "same-origin"
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Cross-Origin-Opener-Policy"] == "same-origin"
    assert "'unsafe-inline'" not in policy(response)["script-src"]


def test_the_api_docs_load_their_start_up_script_from_a_url_not_inline(client_for):
    viewer = client_for("viewer")
    html = viewer.get("/api/docs/").content.decode()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "inline <script> in the docs"
    script = viewer.get("/api/docs/", {"script": ""})
    assert script.status_code == 200
    assert script.headers["Content-Type"].startswith("application/javascript")
    assert b"SwaggerUIBundle" in script.content


def test_no_template_has_inline_script_or_an_inline_event_handler():
    """The policy would block them without a word on the page, so none may exist."""
    found = []
    for template in sorted(TEMPLATES.rglob("*.html")):
        text = template.read_text()
        for match in re.finditer(r"<script(?![^>]*\bsrc=)[^>]*>", text):
            found.append(f"{template.relative_to(TEMPLATES)}: {match.group(0)}")
        for match in re.finditer(r"<[a-z][^>]*\son[a-z]+\s*=", text):
            found.append(f"{template.relative_to(TEMPLATES)}: {match.group(0)[:80]}")
        if re.search(r"\shx-on", text):  # htmx compiles these with eval, which is off
            found.append(f"{template.relative_to(TEMPLATES)}: an hx-on attribute")
        if "javascript:" in text:
            found.append(f"{template.relative_to(TEMPLATES)}: a javascript: URL")
    assert found == []
