"""Two rollout_create calls racing past the active-rollout check: the database decides and
the loser gets the same ValidationError as a sequential second create."""

from __future__ import annotations

import threading
import time

import pytest
from django.core.exceptions import ValidationError
from django.db import connection, connections, transaction

from apps.rollouts.models import Rollout
from apps.rollouts.services import rollout_create

pytestmark = [pytest.mark.db, pytest.mark.django_db(transaction=True)]


def wait_for_blocked_insert(table: str, timeout: float = 10.0) -> None:
    """Until another session waits on a lock while inserting into ``table``."""
    deadline = time.monotonic() + timeout
    with connection.cursor() as cursor:
        while time.monotonic() < deadline:
            cursor.execute("SELECT pg_stat_clear_snapshot()")  # else cached per transaction
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE %s AND pid <> pg_backend_pid()",
                [f'INSERT INTO "{table}"%'],
            )
            if cursor.fetchone()[0]:
                return
            time.sleep(0.05)
    raise AssertionError(f"no blocked INSERT into {table} within {timeout}s")


def test_racing_second_create_gets_the_validation_error(llm, stable, candidate):
    outcome: dict[str, object] = {}

    def second() -> None:
        try:
            rollout_create(
                actor=None,
                model=llm,
                stable_version=stable,
                candidate_version=candidate,
                mode="canary",
            )
        except ValidationError as error:
            outcome["error"] = error
        finally:
            connections.close_all()

    with transaction.atomic():
        first = rollout_create(
            actor=None, model=llm, stable_version=stable, candidate_version=candidate, mode="canary"
        )
        thread = threading.Thread(target=second)
        thread.start()
        # The second create saw no active rollout (ours is uncommitted) and now waits on the
        # unique index for our commit.
        wait_for_blocked_insert("rollouts_rollout")
    thread.join(timeout=10)

    error = outcome["error"]
    assert isinstance(error, ValidationError)
    assert f"already has an active rollout (#{first.pk}, pending" in error.message_dict["model"][0]
    assert Rollout.objects.count() == 1
