"""Writes of the xDS app that people (or commands) start: a gateway's xDS token."""

from __future__ import annotations

import secrets

from django.db import transaction
from django.utils import timezone

from fleetctl.accounts.actor import Actor
from fleetctl.accounts.selectors import secret_hash
from fleetctl.audit.services import audit_record
from fleetctl.xds.models import XdsGateway

TOKEN_PREFIX = "fxds_"


def gateway_token_issue(*, gateway: str, actor: Actor | None = None) -> str:
    """A new token for the Envoys of `gateway` (node.cluster); the previous one stops
    working. Only its SHA-256 is kept: the secret returned is shown once. Audited (who,
    when, which gateway; never the secret)."""
    if not gateway:
        raise ValueError("a token needs a gateway name")
    secret = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with transaction.atomic():
        row, _ = XdsGateway.objects.select_for_update().get_or_create(name=gateway)
        replaced = bool(row.token_sha256)
        row.token_sha256 = secret_hash(secret)
        row.token_issued_at = timezone.now()
        row.save(update_fields=["token_sha256", "token_issued_at"])
        audit_record(actor=actor or Actor.for_system("xds-token"), action="xds.token_issue",
                     target=row, message=f"xDS token issued for gateway {gateway}"
                     + (" (the previous one stops working)" if replaced else ""))
    return secret
