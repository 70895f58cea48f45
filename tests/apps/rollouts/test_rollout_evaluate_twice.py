"""The beat evaluator is idempotent: two evaluations of the same step (two beats overlapping
in a failover, a backlog of evaluate tasks, or two worker processes running them at once)
advance a canary one step, not two."""

from __future__ import annotations

import copy

import pytest
from django.core.exceptions import ValidationError

from apps.rollouts.evaluate import rollout_evaluate
from apps.rollouts.models import Rollout, RolloutEvent
from tests.apps.rollouts.test_rollout_evaluate import (  # noqa: F401 - fixtures
    age_step,
    namespace,
    rollout,
    send,
)

pytestmark = [pytest.mark.db, pytest.mark.django_db]


def test_a_second_evaluation_of_the_same_step_does_not_advance_again(
    namespace,  # noqa: F811 - the imported fixture
    redis_client,
    rollout,  # noqa: F811 - the imported fixture
):
    send(namespace, "v1", n=200)
    send(namespace, "v2", n=60)
    age_step(rollout, 61)
    stale = copy.copy(rollout)  # what a second, concurrent evaluation read before the first acted
    assert rollout_evaluate(rollout=rollout, client=redis_client).action == "advance"
    with pytest.raises(ValidationError, match="already left step 0"):
        rollout_evaluate(rollout=stale, client=redis_client)
    fresh = Rollout.objects.get(pk=rollout.pk)
    assert fresh.current_step == 1
    assert RolloutEvent.objects.filter(rollout=rollout, kind="advance").count() == 1
