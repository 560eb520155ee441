from __future__ import annotations

import datetime as dt
import decimal
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from django.db import models

from fleetctl.audit.models import AuditEvent

if TYPE_CHECKING:
    from fleetctl.accounts.actor import Actor


def _json_safe(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal | uuid.UUID):
        return str(value)
    if isinstance(value, models.Model):
        return value.pk
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_safe(v) for v in value]
    return value


def snapshot(obj: models.Model, fields: Iterable[str]) -> dict[str, Any]:
    """A JSON-safe picture of the named fields (foreign keys as ids) for before/after."""
    picture: dict[str, Any] = {}
    for name in fields:
        field = obj._meta.get_field(name)
        attname = getattr(field, "attname", name)
        picture[name] = _json_safe(getattr(obj, attname))
    return picture


def _event(
    *, actor: Actor, action: str, target: object | None, outcome: str, message: str,
    before: dict[str, Any] | None, after: dict[str, Any] | None,
) -> AuditEvent:
    token = actor.token
    user = actor.user if getattr(actor.user, "pk", None) else None
    object_type = object_id = object_repr = ""
    if isinstance(target, models.Model):
        object_type = target._meta.label_lower
        object_id = str(target.pk or "")
        object_repr = str(target)[:200]
    elif target is not None:
        object_repr = str(target)[:200]
    return AuditEvent(
        actor=actor.label[:150], actor_user=user, token_prefix=token.prefix if token else "",
        action=action, outcome=outcome, object_type=object_type, object_id=object_id,
        object_repr=object_repr, before=_json_safe(before), after=_json_safe(after),
        message=message, request_id=actor.request_id,
    )


def audit_record(
    *, actor: Actor, action: str, target: object | None = None,
    before: dict[str, Any] | None = None, after: dict[str, Any] | None = None,
    message: str = "",
) -> AuditEvent:
    """Record a write. Call it inside the write's transaction so both land or neither does."""
    event = _event(actor=actor, action=action, target=target, outcome="ok", message=message,
                   before=before, after=after)
    event.save()
    return event


def audit_denied(*, actor: Actor, action: str, target: object | None, permission: str) -> None:
    """Record a refused attempt. Services check permissions before they open their
    transaction, so this row is not rolled back with the work it refused."""
    _event(actor=actor, action=action, target=target, outcome="denied",
           message=f"missing permission '{permission}'", before=None, after=None).save()


@contextmanager
def refusals_audited(*, actor: Actor, action: str, target: object | None) -> Iterator[None]:
    """Around a write's transaction: a business rule's refusal (a DomainError) is recorded
    after the rollback, so the row stays, and answers the caller unchanged."""
    from fleetctl.core.errors import DomainError

    try:
        yield
    except DomainError as exc:
        audit_refused(actor=actor, action=action, target=target, message=exc.message)
        raise


def audit_refused(*, actor: Actor, action: str, target: object | None, message: str) -> None:
    """Record an attempt a business rule refused (approving one's own plan, a failing gate…).
    Call it outside the refused work's transaction so the row stays."""
    _event(actor=actor, action=action, target=target, outcome="denied", message=message,
           before=None, after=None).save()


def audit_refusals_replayed(*, actor: Actor, event_ids: list[int], key: str
                            ) -> list[AuditEvent]:
    """A refused request sent again with its Idempotency-Key is answered from the stored
    refusal without running again. It is still an attempt (an auditor counts them), so each
    refusal the first run recorded is recorded again, as this request, marked as a replay:
    `after` names the event it repeats and the key."""
    made = []
    for first in AuditEvent.objects.filter(pk__in=event_ids).order_by("id"):
        event = _event(
            actor=actor, action=first.action, target=None, outcome=AuditEvent.Outcome.DENIED,
            message=(f"{first.message} (replayed: answered again from the refusal stored for "
                     f"its Idempotency-Key; first refused as audit event {first.pk})"),
            before=None, after={**(first.after or {}), "replay_of": first.pk,
                                "idempotency_key": key})
        event.object_type, event.object_id = first.object_type, first.object_id
        event.object_repr = first.object_repr
        event.save()
        made.append(event)
    return made


def audit_auth_refused(*, action: str, target: object | None, message: str,
                       details: dict[str, Any], token_prefix: str = "") -> AuditEvent:
    """Record a refused sign-in or API credential. Nobody is known to be acting, so the actor
    is `anonymous`; `details` says what was tried and from where — callers never put a
    password or a token's secret in it."""
    from fleetctl.accounts.actor import Actor

    event = _event(actor=Actor(), action=action, target=target, outcome="denied",
                   message=message, before=None, after=details)
    event.token_prefix = token_prefix[:16]
    event.save()
    return event
