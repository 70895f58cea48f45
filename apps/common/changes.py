"""The ending most services share: write a row, append its audit event, publish the snapshot.

Both helpers run inside the caller's ``transaction.atomic()`` block, on a row the caller has
validated (and locked, where it must be); they decide nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, models, transaction

from apps.common.audit import audit_record, audit_state
from apps.common.outbox import snapshot_publish_on_commit

_M = TypeVar("_M", bound=models.Model)


def audited_update(
    *,
    actor: AbstractBaseUser | None,
    action: str,
    target: models.Model,
    changes: Mapping[str, Any],
    note: Mapping[str, Any] | None = None,
    publish: bool = True,
) -> None:
    """Set ``changes`` on ``target`` and save only those fields (with ``updated_at`` where the
    model has one); audit them (before and after, ``note`` added to the after); publish the
    snapshot on commit when ``publish`` (the change is something the router reads)."""
    before = audit_state(target, changes)
    for field, value in changes.items():
        setattr(target, field, value)
    stamped = any(field.name == "updated_at" for field in target._meta.concrete_fields)
    target.save(update_fields=[*changes, *(["updated_at"] if stamped else [])])
    after = {**audit_state(target, changes), **(note or {})}
    audit_record(actor=actor, action=action, target=target, before=before, after=after)
    if publish:
        snapshot_publish_on_commit()


def audited_save(
    *,
    actor: AbstractBaseUser | None,
    action: str,
    target: models.Model,
    changes: Mapping[str, Any],
    fields: Iterable[str],
    clash: Mapping[str, str] | None = None,
) -> None:
    """Set ``changes`` on ``target`` and save the whole row; audit ``fields`` (before and
    after) and publish the snapshot on commit. A unique constraint the save breaks is
    ``clash`` as a ValidationError (per field), the caller's transaction left usable."""
    fields = tuple(fields)
    before = audit_state(target, fields)
    for field, value in changes.items():
        setattr(target, field, value)
    try:
        with transaction.atomic():
            target.save()
    except IntegrityError as exc:
        if clash is None:
            raise
        raise ValidationError(dict(clash)) from exc
    audit_record(
        actor=actor, action=action, target=target, before=before, after=audit_state(target, fields)
    )
    snapshot_publish_on_commit()


def audited_upsert(
    *,
    actor: AbstractBaseUser | None,
    action: str,
    model: type[_M],
    lookup: Mapping[str, Any],
    values: Mapping[str, Any],
    fields: Iterable[str],
) -> _M:
    """Create or update the one row matching ``lookup`` with ``values``; audit ``fields``
    (before: None for a new row) and publish the snapshot on commit."""
    fields = tuple(fields)
    current = model._default_manager.select_for_update().filter(**lookup).first()
    before = None if current is None else audit_state(current, fields)
    row, _created = model._default_manager.update_or_create(defaults=dict(values), **lookup)
    audit_record(
        actor=actor, action=action, target=row, before=before, after=audit_state(row, fields)
    )
    snapshot_publish_on_commit()
    return row
