"""The People page: admins only, invite with a one-time link, roles, disable / enable, and
forms that keep what was typed when they refuse it."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from fleetctl.audit.models import AuditEvent
from tests.web.factories import make_user

pytestmark = pytest.mark.django_db

LoginAs = Callable[[User], Client]


@pytest.fixture
def admin(db: None) -> User:
    return make_user("ada-admin", "admin")


def test_only_admins_see_the_page_and_its_nav_entry(login_as: LoginAs, admin: User,
                                                    lead: User, viewer: User):
    page = login_as(admin).get(reverse("people:list"))
    assert page.status_code == 200
    html = page.content.decode()
    assert 'href="/people/" aria-current="page">People</a>' in html
    for name in ("ada-admin", "lena-lead", "vera-viewer"):
        assert f'data-person="{name}"' in html
    for user in (lead, viewer):
        refused = login_as(user).get(reverse("people:list"))
        assert refused.status_code == 403
        assert "Only admins manage people" in refused.content.decode()
        assert ">People</a>" not in login_as(user).get("/").content.decode()
    assert AuditEvent.objects.filter(action="web.people", outcome="denied").count() == 2


def test_invite_shows_the_link_once(login_as: LoginAs, admin: User):
    client = login_as(admin)
    response = client.post(reverse("people:list"), {
        "username": "bo", "email": "bo@example.org", "roles": ["on-call", "viewer"]})
    assert response.status_code == 200
    assert "no-store" in response["Cache-Control"]
    link = response.context["invite_link"]
    assert link.startswith("http://testserver/account/set-password/")
    html = response.content.decode()
    assert html.count(link) == 1 and "only time the link is shown" in html
    assert sorted(User.objects.get(username="bo").groups.values_list("name", flat=True)) == [
        "on-call", "viewer"]
    later = client.get(reverse("people:list")).content.decode()
    assert link not in later and "invited, no password yet" in later


def test_invite_errors_keep_what_was_typed(login_as: LoginAs, admin: User):
    response = login_as(admin).post(reverse("people:list"), {
        "username": "ada-admin", "email": "bo@example.org", "roles": ["viewer"]})
    assert response.status_code == 200
    form = response.context["form"]
    assert "already called" in " ".join(form.errors["username"])
    html = response.content.decode()
    assert 'value="bo@example.org"' in html and 'value="ada-admin"' in html
    response = login_as(admin).post(reverse("people:list"), {
        "username": "bo", "email": "nope"})
    assert set(response.context["form"].errors) == {"email", "roles"}
    assert not User.objects.filter(username="bo").exists()


def test_set_roles_and_the_last_admin_guard(login_as: LoginAs, admin: User, viewer: User):
    client = login_as(admin)
    url = reverse("people:detail", args=["vera-viewer"])
    done = client.post(url, {"roles": ["on-call"]}, follow=True)
    assert "Roles of vera-viewer: on-call." in done.content.decode()
    assert list(viewer.groups.values_list("name", flat=True)) == ["on-call"]
    refused = client.post(reverse("people:detail", args=["ada-admin"]), {"roles": ["viewer"]})
    assert refused.status_code == 409
    assert "last active admin" in refused.content.decode()
    assert list(admin.groups.values_list("name", flat=True)) == ["admin"]


def test_disable_and_enable_from_the_page(login_as: LoginAs, admin: User, viewer: User):
    client = login_as(admin)
    active_url = reverse("people:active", args=["vera-viewer"])
    page = client.post(active_url, {"active": "0"}, follow=True).content.decode()
    assert "vera-viewer is disabled" in page and "Enable vera-viewer" in page
    viewer.refresh_from_db()
    assert not viewer.is_active
    assert "person.disable" in page  # the page's own history
    client.post(active_url, {"active": "1"})
    viewer.refresh_from_db()
    assert viewer.is_active
    mine = client.get(reverse("people:detail", args=["ada-admin"])).content.decode()
    assert "You cannot disable yourself" in mine and "Disable ada-admin" not in mine
    client.post(reverse("people:active", args=["ada-admin"]), {"active": "0"})
    admin.refresh_from_db()
    assert admin.is_active
    bad = client.post(active_url, {"active": "maybe"}, follow=True).content.decode()
    assert "Say whether to enable" in bad


def test_a_new_set_password_link(login_as: LoginAs, admin: User, viewer: User):
    response = login_as(admin).post(reverse("people:link", args=["vera-viewer"]))
    assert response.status_code == 200 and "no-store" in response["Cache-Control"]
    assert response.context["link"].startswith("http://testserver/account/set-password/")
    assert AuditEvent.objects.filter(action="person.set_password_link", outcome="ok").exists()
    assert login_as(admin).get(reverse("people:detail", args=["nobody"])).status_code == 404
