"""Publish-on-commit: how a service tells the data plane that something it holds changed.

Every change the data plane must know writes a :class:`~apps.common.models.SnapshotOutbox` row
in its own transaction (:func:`snapshot_publish_on_commit`). Once the transaction commits,
:data:`outbox_committed` is sent; the top app (``apps.core``, which alone knows how to build
the snapshot from every app) drains the outbox then. When that publish fails (Redis down), the
rows stay and the beat task ``snapshot_outbox_drain`` retries until a snapshot built after the
change is in Redis. The base app thus never imports the apps above it.
"""

from __future__ import annotations

import logging

from django.db import transaction
from django.dispatch import Signal

from apps.common.models import SnapshotOutbox

logger = logging.getLogger(__name__)

# Sent (no arguments) after a transaction that wrote an outbox entry commits.
outbox_committed = Signal()


def _publish_after_commit() -> None:
    for receiver, result in outbox_committed.send_robust(sender=SnapshotOutbox):
        if isinstance(result, Exception):
            # The change and its outbox entry are committed; the beat task drains it later.
            logger.error(
                "snapshot publish after commit failed in %r; the outbox drain will retry",
                receiver,
                exc_info=result,
            )


def snapshot_publish_on_commit(*, reason: str = "") -> None:
    """Make the data plane learn about this transaction's changes, even if Redis is down.

    Writes one outbox entry in the current transaction and publishes once it commits (once per
    transaction). Outside a transaction (autocommit) it does both at once. Every service that
    changes something the data plane holds ends with this call.
    """
    connection = transaction.get_connection()
    if connection.in_atomic_block and any(
        func is _publish_after_commit for _sids, func, _robust in connection.run_on_commit
    ):
        return
    SnapshotOutbox.objects.create(reason=reason[:200])
    transaction.on_commit(_publish_after_commit)
