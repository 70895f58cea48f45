"""Operator REST API for rollout transitions: start, advance, pause, resume, promote, roll back.

Each ``POST /api/v1/ops/rollouts/<id>/<action>/`` queues the action's Celery task
(``apps.rollouts.tasks``) and answers 202 with the task id; ``GET /api/v1/ops/tasks/<id>/``
then reports the new state (SUCCESS, ``result``) or the service's refusal (FAILURE,
``error`` carries the service's message). The view checks only what it can without racing the
task: the rollout exists (404) and the body is valid (400). Whether the transition is allowed
is the service's call, made under the row lock inside the task.
"""

from __future__ import annotations

from typing import Any

from django.http import Http404
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.common.api_support import TaskAcceptedSerializer, accepted
from apps.rollouts import tasks
from apps.rollouts.models import Rollout
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


def _schema(action: str, body: type[serializers.Serializer[Any]] | None, doc: str) -> Any:
    return extend_schema_view(
        post=extend_schema(
            operation_id=f"ops_rollouts_{action}",
            request=body,
            responses={202: TaskAcceptedSerializer},
            examples=[QUEUED] if body is None else [QUEUED, WITH_REASON],
            tags=["ops: rollouts"],
            description=doc + " Queued as a Celery task; its status reports the new state, or "
            "FAILURE with the reason the transition was refused.",
        )
    )


class _RolloutActionApi(OperatorApi):
    """Queue ``task`` for the rollout in the path; ``body`` validates the request body."""

    serializer_class = TaskAcceptedSerializer
    task: Any  # a Celery task from apps.rollouts.tasks taking rollout_id, actor_id (, reason)
    body: type[serializers.Serializer[Any]] | None = None

    def post(self, request: Request, pk: int) -> Response:
        kwargs: dict[str, Any] = {}
        if self.body is not None:
            body = self.body(data=request.data)
            body.is_valid(raise_exception=True)
            kwargs = dict(body.validated_data)
        if not Rollout.objects.filter(pk=pk).exists():
            raise Http404
        queued = self.task.delay(rollout_id=pk, actor_id=request.user.pk, **kwargs)
        return accepted(request, queued.id)


@_schema("start", None, "Pending → warming, then the warmup: running at step 0, or aborted.")
class OpsRolloutStartApi(_RolloutActionApi):
    task = tasks.rollout_start


@_schema("advance", RolloutReasonSerializer, "Running → the next step (a canary's last promotes).")
class OpsRolloutAdvanceApi(_RolloutActionApi):
    task = tasks.rollout_advance
    body = RolloutReasonSerializer


@_schema("pause", RolloutReasonSerializer, "Running → paused; the candidate keeps its share.")
class OpsRolloutPauseApi(_RolloutActionApi):
    task = tasks.rollout_pause
    body = RolloutReasonSerializer


@_schema("resume", None, "Paused → running; the step's window restarts.")
class OpsRolloutResumeApi(_RolloutActionApi):
    task = tasks.rollout_resume


@_schema("promote", RolloutReasonSerializer, "Running or paused → promoted (candidate 100 %).")
class OpsRolloutPromoteApi(_RolloutActionApi):
    task = tasks.rollout_promote
    body = RolloutReasonSerializer


@_schema("rollback", RolloutRollbackSerializer, "Warming, running or paused → rolled back.")
class OpsRolloutRollbackApi(_RolloutActionApi):
    task = tasks.rollout_rollback
    body = RolloutRollbackSerializer
