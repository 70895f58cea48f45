"""The rollout actions table is the one place the front doors and services read: every task
it names exists with keyword-only arguments matching its reason rule, and each front door
offers exactly the table's actions."""

from __future__ import annotations

import inspect

import pytest
from celery import current_app
from django.core.exceptions import ValidationError

from apps.rollouts import tasks
from apps.rollouts.actions import ROLLOUT_ACTIONS, operator_actions, rollout_action
from apps.rollouts.api_actions import rollout_action_urls
from apps.rollouts.models import Rollout

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("action", [a for a in ROLLOUT_ACTIONS if a.task], ids=lambda a: a.name)
def test_every_task_is_keyword_only_and_takes_the_reason_its_row_says(action):
    assert tasks.__name__  # the module defines (and so registers) the tasks
    task = current_app.tasks[action.task]
    parameters = inspect.signature(task.run).parameters
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in parameters.values())
    assert {"rollout_id", "actor_id"} <= set(parameters)
    assert ("reason" in parameters) is action.takes_reason
    if action.takes_reason:
        required = parameters["reason"].default is inspect.Parameter.empty
        assert required is action.needs_reason


def test_states_and_names_are_the_models():
    states = set(Rollout.State.values)
    for action in ROLLOUT_ACTIONS:
        assert set(action.states) <= states, action.name
    assert len({a.name for a in ROLLOUT_ACTIONS}) == len(ROLLOUT_ACTIONS)
    assert rollout_action("rollback").description().startswith("Warming, running or paused → ")
    with pytest.raises(KeyError):
        rollout_action("explode")


def test_reason_rules():
    assert rollout_action("advance").reason_check("  why ") == "why"
    assert rollout_action("advance").reason_check("") == ""
    with pytest.raises(ValidationError, match="rolled back"):
        rollout_action("rollback").reason_check("  ")


def test_rest_offers_the_table_actions_with_a_task():
    offered = {str(p.pattern).split("/")[-2] for p in rollout_action_urls()}
    assert offered == {a.name for a in operator_actions().values() if a.task}
    assert offered == {"start", "advance", "pause", "resume", "promote", "rollback"}


def test_queue_refuses_an_action_without_a_task():
    with pytest.raises(ValueError, match="no task"):
        tasks.rollout_action_queue(rollout_action("cancel"), rollout_id=1, actor_id=None)
