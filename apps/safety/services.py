"""Writing policy packs and attachments (validated, audited, published to the routers).

A pack's rules are checked by the data plane's own grammar (:func:`runtime.safety.rules.
pack_errors`), so the admin form, the REST body and this service refuse a malformed pack with
the same field errors (``rules[2].patterns[0]``: "not a valid regular expression: ...").
Packs are immutable: a change is a new version (:func:`pack_create` numbers it), and the
snapshot carries each name's newest one.
"""

from __future__ import annotations

import re
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Max

from apps.common.audit import audit_record
from apps.common.outbox import snapshot_publish_on_commit
from apps.models.models import Model
from apps.safety.models import PolicyAttachment, PolicyPack
from apps.tenants.models import Tenant
from runtime.safety.rules import pack_errors

PACK_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")  # it names metrics' label values and events


def pack_validate(*, name: str, version: int, rules: Any) -> None:
    """Raise one ``ValidationError`` keyed by field when the pack is malformed."""
    errors: dict[str, list[str]] = {}
    if not PACK_NAME.fullmatch(name):
        errors["name"] = ["1-64 letters, digits, '_', '.' or '-'."]
    for field, message in pack_errors({"name": name, "version": version, "rules": rules}):
        errors.setdefault(field, []).append(message)
    if errors:
        raise ValidationError(errors)


def pack_next_version(name: str) -> int:
    latest = PolicyPack.objects.filter(name=name).aggregate(v=Max("version"))["v"]
    return int(latest or 0) + 1


def pack_create(
    *,
    actor: AbstractBaseUser | None,
    name: str,
    rules: Any,
    description: str = "",
    version: int | None = None,
) -> PolicyPack:
    """A new pack, or a new version of one (``version`` None: the next number)."""
    number = pack_next_version(name) if version is None else version
    pack_validate(name=name, version=number, rules=rules)
    if PolicyPack.objects.filter(name=name, version=number).exists():
        raise ValidationError({"version": f"{name} v{number} exists; packs are immutable"})
    with transaction.atomic():
        pack = PolicyPack.objects.create(
            name=name, version=number, rules=rules, description=description
        )
        audit_record(actor=actor, action="safety.pack.create", target=pack,
                     after={"name": name, "version": number, "rules": len(rules)})  # fmt: skip
        snapshot_publish_on_commit(reason="safety pack")
    return pack


def attachment_validate(*, pack_name: str, tenant: Tenant | None, model: Model | None) -> None:
    if (tenant is None) == (model is None):
        raise ValidationError({"tenant": "Attach a pack to a tenant or to a model (one)."})
    if not PolicyPack.objects.filter(name=pack_name).exists():
        raise ValidationError({"pack_name": f"No policy pack is named {pack_name!r}."})
    taken = PolicyAttachment.objects.filter(pack_name=pack_name, tenant=tenant, model=model)
    if taken.exists():
        raise ValidationError({"pack_name": f"{pack_name!r} is already attached there."})


def attachment_create(
    *,
    actor: AbstractBaseUser | None,
    pack_name: str,
    tenant: Tenant | None = None,
    model: Model | None = None,
) -> PolicyAttachment:
    attachment_validate(pack_name=pack_name, tenant=tenant, model=model)
    with transaction.atomic():
        attachment = PolicyAttachment.objects.create(pack_name=pack_name, tenant=tenant,
                                                     model=model)  # fmt: skip
        audit_record(actor=actor, action="safety.attachment.create", target=attachment,
                     after={"pack": pack_name, "target": str(attachment)})  # fmt: skip
        snapshot_publish_on_commit(reason="safety attachment")
    return attachment


def attachment_delete(*, actor: AbstractBaseUser | None, attachment: PolicyAttachment) -> None:
    with transaction.atomic():
        audit_record(actor=actor, action="safety.attachment.delete", target=attachment,
                     before={"pack": attachment.pack_name, "target": str(attachment)})  # fmt: skip
        attachment.delete()
        snapshot_publish_on_commit(reason="safety attachment")
