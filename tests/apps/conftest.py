"""Fixtures shared by the control-plane app tests."""

from __future__ import annotations

from typing import Any

import pytest
from django.db import connection

from apps.common.outbox import _publish_after_commit


class PublishTracker:
    """Whether a snapshot publish waits for the test transaction's commit.

    `snapshot_publish_on_commit()` registers at most one callback per transaction, and a test
    runs in one transaction, so a test forgets the pending ones (`reset()`) before the call
    it checks. The callbacks never run: the test transaction is rolled back.
    """

    def reset(self) -> None:
        connection.run_on_commit[:] = [
            entry for entry in connection.run_on_commit if entry[1] is not _publish_after_commit
        ]

    @property
    def pending(self) -> bool:
        return any(entry[1] is _publish_after_commit for entry in connection.run_on_commit)


@pytest.fixture
def publishes() -> PublishTracker:
    return PublishTracker()


@pytest.fixture(autouse=True)
def _fast_password_hasher(settings: Any) -> None:
    """Admin tests log users in; the default PBKDF2 costs ~0.6 s a login."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
