"""Audited create/update/delete for registry rows: check the permission, validate the whole
row, write it and its audit event in one transaction. Domain services call these and add
their own rules around them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, TypeVar

from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction
from django.db.models.deletion import ProtectedError, RestrictedError

from fleetctl.audit.services import audit_record, snapshot
from fleetctl.core.errors import ConflictError

if TYPE_CHECKING:
    from fleetctl.accounts.actor import Actor

M = TypeVar("M", bound=models.Model)


def editable_fields(model: type[models.Model]) -> list[str]:
    return [f.name for f in model._meta.concrete_fields if f.editable and not f.primary_key]


def _snapshot_fields(instance: models.Model) -> list[str]:
    return ["id", *editable_fields(type(instance))]


def _save_validated(instance: models.Model) -> None:
    instance.full_clean()
    try:
        with transaction.atomic():
            instance.save()
    except IntegrityError as exc:
        # Lost a race with another writer on a unique field; say it the way full_clean would.
        raise ValidationError({"__all__": [f"Conflicts with an existing row: {exc}"]}) from exc


def audited_create(
    *, actor: Actor, permission: str, action: str, instance: M
) -> M:
    actor.require(permission, action=action, target=instance._meta.label_lower)
    with transaction.atomic():
        _save_validated(instance)
        audit_record(actor=actor, action=action, target=instance,
                     after=snapshot(instance, _snapshot_fields(instance)))
    return instance


def audited_update(
    *, actor: Actor, permission: str, action: str, instance: M, changes: dict[str, Any],
    allowed: Iterable[str],
) -> M:
    actor.require(permission, action=action, target=instance)
    unknown = sorted(set(changes) - set(allowed))
    if unknown:
        raise ValidationError({name: ["This field cannot be changed here."] for name in unknown})
    with transaction.atomic():
        locked = type(instance)._default_manager.select_for_update().get(pk=instance.pk)
        fields = _snapshot_fields(locked)
        before = snapshot(locked, fields)
        for name, value in changes.items():
            setattr(locked, name, value)
        _save_validated(locked)
        after = snapshot(locked, fields)
        changed = {k for k in fields if before[k] != after[k]}
        if changed:
            audit_record(
                actor=actor, action=action, target=locked,
                before={k: before[k] for k in sorted(changed)},
                after={k: after[k] for k in sorted(changed)},
            )
    return locked


def audited_delete(*, actor: Actor, permission: str, action: str, instance: models.Model,
                   message: str = "", after: dict[str, Any] | None = None) -> None:
    """`message`, `after`: what the deletion did besides removing the row (records it kept,
    rows that went with it), for the event."""
    actor.require(permission, action=action, target=instance)
    try:
        with transaction.atomic():
            before = snapshot(instance, _snapshot_fields(instance))
            audit_record(actor=actor, action=action, target=instance, before=before,
                         after=after, message=message)
            instance.delete()
    except (ProtectedError, RestrictedError) as exc:
        blockers = sorted({str(obj) for obj in exc.protected_objects} if isinstance(
            exc, ProtectedError) else {str(obj) for obj in exc.restricted_objects})
        shown = ", ".join(blockers[:5]) + (" …" if len(blockers) > 5 else "")
        raise ConflictError(
            f"{instance} is still used by {len(blockers)} object(s) ({shown}); "
            "move or delete them first."
        ) from exc
