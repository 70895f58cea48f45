"""Operator REST API for rollout transitions: start, advance, pause, resume, promote, roll back.

One view per row of the actions table (:mod:`apps.rollouts.actions`) that has a task: each
``POST /api/v1/ops/rollouts/<id>/<action>/`` queues that task and answers 202 with the task
id; its OpenAPI text (from-states, result, reason rule) is the table's.
``GET /api/v1/ops/tasks/<id>/`` then reports the new state (SUCCESS, ``result``) or the
service's refusal (FAILURE, ``error`` carries the service's message). The view checks only
what it can without racing the task: the rollout exists (404) and the body is valid (400).
Whether the transition is allowed is the service's call, made under the row lock inside the
task.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404
from django.urls import URLPattern, path
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.common.api_support import TaskAcceptedSerializer, accepted, validated_body
from apps.rollouts.actions import RolloutAction, operator_actions
from apps.rollouts.models import Rollout
from apps.rollouts.tasks import rollout_action_queue
from apps.tenants.api_ops import OperatorApi

QUEUED = OpenApiExample(
    "queued",
    value={"task_id": "5b1c…", "status_url": "http://127.0.0.1:8000/api/v1/ops/tasks/5b1c…/"},
    response_only=True,
    status_codes=["202"],
)
WITH_REASON = OpenApiExample(
    "with a reason", value={"reason": "p95 TTFT regressed on the candidate"}, request_only=True
)


class RolloutReasonSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(
        max_length=2000,
        allow_blank=True,
        required=False,
        default="",
        help_text="Why; recorded on the rollout's event and in the audit log.",
    )


class RolloutRollbackSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(max_length=2000, help_text="Why it is rolled back (required).")


def _body(action: RolloutAction) -> type[serializers.Serializer[Any]] | None:
    """The request body an action reads: none, an optional reason, or a required one."""
    if not action.takes_reason:
        return None
    return RolloutRollbackSerializer if action.needs_reason else RolloutReasonSerializer


class _RolloutActionApi(OperatorApi):
    """Queue ``action``'s task for the rollout in the path; ``body`` validates the request."""

    serializer_class = TaskAcceptedSerializer
    action: RolloutAction
    body: type[serializers.Serializer[Any]] | None = None

    def post(self, request: Request, pk: int) -> Response:
        reason = ""
        if self.body is not None:
            body = validated_body(self.body, request)
            reason = body["reason"]
        if not Rollout.objects.filter(pk=pk).exists():
            raise Http404
        queued = rollout_action_queue(
            self.action, rollout_id=pk, actor_id=request.user.pk, reason=reason
        )
        return accepted(request, queued.id)


def rollout_action_view(action: RolloutAction) -> type[_RolloutActionApi]:
    """The REST view of one row of the actions table, with its OpenAPI description."""
    body = _body(action)
    view = type(
        f"OpsRollout{action.name.title()}Api",
        (_RolloutActionApi,),
        {"action": action, "body": body, "__doc__": action.description()},
    )
    description = (
        f"{action.description()} Queued as a Celery task; its status reports the new state, "
        "or FAILURE with the reason the transition was refused."
    )
    schema = extend_schema_view(
        post=extend_schema(
            operation_id=f"ops_rollouts_{action.name}",
            request=body,
            responses={202: TaskAcceptedSerializer},
            examples=[QUEUED] if body is None else [QUEUED, WITH_REASON],
            tags=["ops: rollouts"],
            description=description,
        )
    )
    decorated: type[_RolloutActionApi] = schema(view)
    return decorated


def rollout_action_urls() -> list[URLPattern]:
    """``rollouts/<pk>/<action>/`` for every operator action that runs as a task."""
    return [
        path(f"rollouts/<int:pk>/{action.name}/", rollout_action_view(action).as_view())
        for action in operator_actions().values()
        if action.task is not None
    ]
