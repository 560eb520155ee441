"""An xDS token per gateway: issued once, kept as a hash, and audited without its secret."""

from __future__ import annotations

import pytest

from fleetctl.accounts.selectors import secret_hash
from fleetctl.audit.models import AuditEvent
from fleetctl.xds.models import XdsGateway
from fleetctl.xds.services import gateway_token_issue

pytestmark = pytest.mark.django_db


def test_issuing_a_token_keeps_its_hash_and_audits_it_without_the_secret():
    first = gateway_token_issue(gateway="edge-eu")
    second = gateway_token_issue(gateway="edge-eu")
    row = XdsGateway.objects.get(name="edge-eu")
    assert row.token_sha256 == secret_hash(second) != secret_hash(first)
    events = list(AuditEvent.objects.filter(action="xds.token_issue").order_by("id"))
    assert [e.message for e in events] == [
        "xDS token issued for gateway edge-eu",
        "xDS token issued for gateway edge-eu (the previous one stops working)"]
    for event in events:
        assert first not in str(event.__dict__) and second not in str(event.__dict__)
