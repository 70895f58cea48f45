"""Two rollout_create calls racing past the active-rollout check: the database decides and
the loser gets the same ValidationError as a sequential second create."""

from __future__ import annotations

import threading

import pytest
from django.core.exceptions import ValidationError
from django.db import connections, transaction
from fixtures.db_locks import wait_for_blocked_insert

from apps.rollouts.models import Rollout
from apps.rollouts.services import rollout_create

pytestmark = [pytest.mark.db, pytest.mark.django_db(transaction=True)]


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
