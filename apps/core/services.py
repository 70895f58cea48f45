"""The top app's services: building and publishing the runtime snapshot.

Every change the data plane must know writes a :class:`~apps.common.models.SnapshotOutbox` row
in its own transaction (:func:`apps.common.outbox.snapshot_publish_on_commit`). After the
commit the outbox is drained at once (:func:`drain_after_commit`, connected to
``outbox_committed`` when the app is ready); when that publish fails (Redis down), the rows
stay, and the beat task ``snapshot_outbox_drain`` retries every
``SWITCHYARD_SNAPSHOT_OUTBOX_RETRY_S`` seconds until a snapshot built after the change is in
Redis. A revocation is thus enforced by routers within
one retry interval of Redis coming back, not at the next periodic refresh.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import transaction
from django.db.models import F
from django.utils import timezone
from redis.exceptions import RedisError

from apps.common.models import SnapshotOutbox
from apps.core.publisher import publish_current, publish_if_changed

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OutboxDrain:
    """What one drain did: ``delivered`` entries published as ``version``, or ``error``."""

    delivered: int = 0
    pending: int = 0
    version: int | None = None
    error: str = ""


def snapshot_publish() -> int:
    """Build the runtime snapshot from the database and publish it to Redis now.

    Returns the published version number.
    """
    return publish_current()


def snapshot_refresh() -> int | None:
    """Republish the snapshot if the database says something the published one does not.

    The periodic safety net behind the outbox (a change written around it, by hand or by a
    tool). When nothing changed it confirms the published version as current, which keeps
    routers from reporting it stale. Returns the new version, or None when unchanged.
    """
    return publish_if_changed()


def snapshot_outbox_drain() -> OutboxDrain:
    """Publish one snapshot covering every waiting outbox entry; delete them once it landed.

    Entries are locked (``SKIP LOCKED``) before the snapshot is built, so a publish covers
    exactly the changes committed before it; a concurrent drain takes only the others. A
    Redis failure is recorded on the entries (attempts, last error) and logged, not raised.
    """
    with transaction.atomic():
        ids = list(
            SnapshotOutbox.objects.select_for_update(skip_locked=True).values_list("pk", flat=True)
        )
        if not ids:
            return OutboxDrain()
        try:
            version = publish_current()
        except (RedisError, OSError) as exc:
            error = f"{type(exc).__name__}: {exc}"[:2000]
            SnapshotOutbox.objects.filter(pk__in=ids).update(
                attempts=F("attempts") + 1, last_attempt_at=timezone.now(), last_error=error
            )
            logger.warning(
                "snapshot publish failed (%s); %d change(s) wait in the outbox and are retried",
                error,
                len(ids),
            )
            return OutboxDrain(pending=len(ids), error=error)
        SnapshotOutbox.objects.filter(pk__in=ids).delete()
    return OutboxDrain(delivered=len(ids), version=version)


def drain_after_commit(**_signal: object) -> None:
    """``outbox_committed`` receiver: drain the outbox now that the change is committed."""
    snapshot_outbox_drain()
