from __future__ import annotations

from datetime import datetime
from typing import Any

from django.apps import AppConfig


class AuditConfig(AppConfig):
    name = "fleetctl.audit"
    label = "audit"
    verbose_name = "Audit"

    def ready(self) -> None:
        from fleetctl.core.idempotency import witness_register

        witness_register("audit", keep=_refusals_kept, replayed=_refusals_replayed)


def _refusals_kept(request: Any, since: datetime) -> list[int] | None:
    """Beside an answer kept for its Idempotency-Key: the refusals its request recorded."""
    from fleetctl.audit.selectors import refusals_of_request

    return refusals_of_request(request_id=getattr(request, "request_id", ""),
                               since=since) or None


def _refusals_replayed(request: Any, kept: Any, key: str) -> None:
    from fleetctl.accounts.permissions import actor_from_request
    from fleetctl.audit.services import audit_refusals_replayed

    if isinstance(kept, list) and kept:
        audit_refusals_replayed(actor=actor_from_request(request),
                                event_ids=[int(pk) for pk in kept], key=key)
