"""Platform-wide services: publishing the runtime snapshot after a change commits."""

from __future__ import annotations

import logging

from django.db import transaction

logger = logging.getLogger(__name__)


def snapshot_publish() -> int:
    """Build the runtime snapshot from the database and publish it to Redis now.

    Returns the published version number.
    """
    from apps.core.publisher import publish_current  # noqa: PLC0415 - keeps import graph acyclic

    return publish_current()


def snapshot_refresh() -> int | None:
    """Republish the snapshot if the database says something the published one does not.

    The periodic safety net behind :func:`snapshot_publish_on_commit` (a publish can fail after
    its commit, e.g. while Redis is down). Returns the new version, or None when unchanged.
    """
    from apps.core.publisher import publish_if_changed  # noqa: PLC0415 - see snapshot_publish

    return publish_if_changed()


def _publish_after_commit() -> None:
    try:
        snapshot_publish()
    except Exception:
        # The change is committed; the beat task `snapshot_refresh` republishes within 30 s.
        logger.exception("snapshot publish after commit failed; the periodic refresh will retry")


def snapshot_publish_on_commit() -> None:
    """Publish a new snapshot once the current transaction commits (once per transaction).

    Every service that changes something the data plane holds ends with this call.
    Outside a transaction (autocommit) it publishes at once.
    """
    connection = transaction.get_connection()
    if connection.in_atomic_block and any(
        func is _publish_after_commit for _sids, func, _robust in connection.run_on_commit
    ):
        return
    transaction.on_commit(_publish_after_commit)
