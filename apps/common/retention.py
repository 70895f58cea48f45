"""Retention: how long each growing table keeps its rows, applied in bounded batches.

A model takes part by declaring ``retention: ClassVar[Retention]`` (its policy's name, the
timestamp field that ages a row, and whether rows are archived first); this app finds them
through Django's app registry, so it imports no app above it. The ages are settings
(``RETENTION_DAYS``, by policy name; 0 keeps rows forever), and :func:`retention_apply` (the
Celery task ``apps.common.tasks.retention_apply``, on beat) deletes rows older than their age:
at most ``RETENTION_BATCH_ROWS`` rows per batch and ``RETENTION_MAX_BATCHES`` batches per table
per run, oldest first, so one run is bounded and a backlog drains over several.

An archived table (the audit log) is never deleted without its copy: each batch is first
written to ``RETENTION_ARCHIVE_DIR/<policy>/<policy>-<first id>-<last id>.jsonl.gz`` (one JSON
object per row, written to a temporary name, flushed to disk, then renamed), and only then
deleted; the audit log's append-only trigger refuses a DELETE of any row above the id the
transaction declares archived (``SET LOCAL switchyard.archived_through``). Each run that purged
something logs it and records an audit event ``retention.purge`` (rows per policy, archive
files).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.checks import CheckMessage, Error
from django.core.exceptions import ImproperlyConfigured
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction
from django.utils import timezone

from apps.common.audit import SYSTEM_ACTOR_LABEL
from apps.common.models import AuditEvent
from apps.common.retention_policy import Retention

logger = logging.getLogger(__name__)
ARCHIVED_THROUGH = "switchyard.archived_through"  # the trigger reads it (common 0002)


@dataclass(frozen=True, slots=True)
class Purged:
    policy: str
    rows: int
    archives: tuple[str, ...] = ()
    more: bool = False  # the run stopped at its batch bound with old rows left


def retention_models() -> dict[str, type[models.Model]]:
    """Every installed model that declares a retention policy, by policy name."""
    found: dict[str, type[models.Model]] = {}
    for model in apps.get_models():
        policy = getattr(model, "retention", None)
        if isinstance(policy, Retention):
            if policy.name in found:
                raise ImproperlyConfigured(f"two models declare retention {policy.name!r}")
            found[policy.name] = model
    return found


def retention_age(policy: Retention) -> timedelta | None:
    """The policy's age from the settings (None: kept forever); refused when too short."""
    days = float(settings.RETENTION_DAYS.get(policy.name, 0))
    if days <= 0:
        return None
    if days < policy.min_days:
        raise ImproperlyConfigured(
            f"RETENTION_DAYS[{policy.name!r}] is {days:g}; it must be 0 (keep) or at least "
            f"{policy.min_days:g} days (its SWITCHYARD_RETENTION_*_DAYS variable; see "
            "docs/operations/data-protection.md)"
        )
    return timedelta(days=days)


def _archive(directory: Path, name: str, rows: list[dict[str, Any]]) -> Path:
    """Write ``rows`` as gzipped JSON lines, durably, before anything is deleted."""
    target = directory / name / f"{name}-{rows[0]['id']}-{rows[-1]['id']}.jsonl.gz"
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".partial")
    with open(partial, "wb") as raw:
        with gzip.GzipFile(fileobj=raw, mode="wb") as out:
            for row in rows:
                out.write(json.dumps(row, cls=DjangoJSONEncoder, sort_keys=True).encode())
                out.write(b"\n")
        raw.flush()
        os.fsync(raw.fileno())
    os.replace(partial, target)
    return target


def _delete_archived(model: type[models.Model], ids: list[int]) -> int:
    """Delete archived rows (raw SQL: the audit log's manager refuses deletes), declaring
    them archived to the table's trigger for this transaction only."""
    table = connection.ops.quote_name(model._meta.db_table)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute("SELECT set_config(%s, %s, true)", [ARCHIVED_THROUGH, str(max(ids))])
        cursor.execute(f"DELETE FROM {table} WHERE id = ANY(%s)", [ids])  # noqa: S608
        return int(cursor.rowcount)


def _purge(model: type[models.Model], policy: Retention, cutoff: datetime) -> Purged:
    batch_rows = int(settings.RETENTION_BATCH_ROWS)
    archives: list[str] = []
    removed = 0
    old = model._default_manager.filter(**{f"{policy.field}__lt": cutoff}).order_by("pk")
    for _ in range(int(settings.RETENTION_MAX_BATCHES)):
        if policy.archive:
            rows = list(old.values()[:batch_rows])
            if not rows:
                return Purged(policy.name, removed, tuple(archives))
            path = _archive(Path(settings.RETENTION_ARCHIVE_DIR), policy.name, rows)
            archives.append(str(path))
            removed += _delete_archived(model, [row["id"] for row in rows])
        else:
            ids = list(old.values_list("pk", flat=True)[:batch_rows])
            if not ids:
                return Purged(policy.name, removed)
            removed += model._default_manager.filter(pk__in=ids).delete()[0]
    return Purged(policy.name, removed, tuple(archives), more=old.exists())


def retention_check(app_configs: Any = None, **_kwargs: Any) -> list[CheckMessage]:
    """The system check (``switchyard.E002``): every retention age is usable."""
    errors: list[CheckMessage] = []
    for model in retention_models().values():
        try:
            retention_age(model.retention)  # type: ignore[attr-defined]
        except ImproperlyConfigured as exc:
            errors.append(Error(str(exc), id="switchyard.E002"))
    return errors


def retention_apply(*, now: datetime | None = None) -> list[Purged]:
    """Apply every policy once (bounded, see the module); what each purged. Every age is
    checked before anything is deleted."""
    now = now or timezone.now()
    done: list[Purged] = []
    plans = [(name, model, model.retention, retention_age(model.retention))  # type: ignore[attr-defined]
             for name, model in sorted(retention_models().items())]  # fmt: skip
    for name, model, policy, age in plans:
        if age is None:
            continue
        purged = _purge(model, policy, now - age)
        if purged.rows:
            logger.info("retention: %s purged %d rows older than %s%s", name, purged.rows,
                        age, " (more left for the next run)" if purged.more else "")  # fmt: skip
        done.append(purged)
    if any(p.rows for p in done):
        AuditEvent.objects.create(
            actor_label=SYSTEM_ACTOR_LABEL, action="retention.purge", target_type="retention",
            target_id="", target_repr="retention",
            after={p.policy: {"rows": p.rows, "archives": list(p.archives), "more": p.more}
                   for p in done if p.rows},
        )  # fmt: skip
    return done
