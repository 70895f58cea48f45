"""Operator REST API for platform tasks: queue a snapshot refresh (202 with the Celery task
id) and read any task's status."""

from __future__ import annotations

from typing import Any

from celery.result import AsyncResult
from drf_spectacular.utils import OpenApiExample, extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.common.api_support import TaskAcceptedSerializer, accepted
from apps.core.tasks import snapshot_refresh
from apps.tenants.api_ops import OperatorApi


class TaskStatusSerializer(serializers.Serializer[Any]):
    task_id = serializers.CharField()
    state = serializers.CharField(
        help_text="PENDING (unknown or queued), STARTED, RETRY, SUCCESS or FAILURE."
    )
    result = serializers.JSONField(allow_null=True, help_text="The return value on SUCCESS.")
    error = serializers.CharField(allow_null=True, help_text="The exception on FAILURE.")


class OpsSnapshotRefreshApi(OperatorApi):
    serializer_class = TaskAcceptedSerializer

    @extend_schema(
        operation_id="ops_snapshot_refresh",
        request=None,
        responses={202: TaskAcceptedSerializer},
        examples=[
            OpenApiExample(
                "queued",
                value={
                    "task_id": "5b1c…",
                    "status_url": "http://127.0.0.1:8000/api/v1/ops/tasks/5b1c…/",
                },
                response_only=True,
                status_codes=["202"],
            )
        ],
        tags=["ops: tasks"],
        description="Queue a republish of the runtime snapshot if the database changed.",
    )
    def post(self, request: Request) -> Response:
        return accepted(request, snapshot_refresh.delay().id)


class OpsTaskStatusApi(OperatorApi):
    serializer_class = TaskStatusSerializer

    @extend_schema(operation_id="ops_tasks_get", tags=["ops: tasks"])
    def get(self, request: Request, task_id: str) -> Response:
        result: AsyncResult[Any] = AsyncResult(task_id)
        state = result.state
        data = {
            "task_id": task_id,
            "state": state,
            "result": result.result if state == "SUCCESS" else None,
            "error": repr(result.result) if state == "FAILURE" else None,
        }
        return Response(TaskStatusSerializer(data).data)
