"""Fixtures for the dashboard tests; the data builders live in factories.py."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from django.contrib.auth.models import User
from django.test import Client

from fleetctl.fleet.models import Pool, Region
from tests.web.factories import make_pool, make_region, make_user


@pytest.fixture
def viewer(db: None) -> User:
    return make_user("vera-viewer", "viewer")


@pytest.fixture
def lead(db: None) -> User:
    return make_user("lena-lead", "platform-lead")


@pytest.fixture
def no_role_user(db: None) -> User:
    return make_user("nora-norole", None)


@pytest.fixture
def login_as() -> Callable[[User], Client]:
    def client_for(user: User) -> Client:
        client = Client()
        client.force_login(user)
        return client

    return client_for


@pytest.fixture
def region(db: None) -> Region:
    return make_region("eu-west-1", "EU", "Frankfurt")


@pytest.fixture
def pool(region: Region) -> Pool:
    return make_pool("h200-fra-a", region)
