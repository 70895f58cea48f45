"""The staff feed: rollouts, scaling and the dashboard's queued actions, pushed to operators.

The relay that holds the lease (:mod:`frontend.relay`) builds one control document a second
(:func:`control_document`: a handful of queries, made once for the whole deployment, not once
per browser) and sends it to the staff group; it also keeps the latest one in Redis
(``{ns}:live:control``) so a page that (re)connects gets it at once. Tenant users never
receive it (:mod:`frontend.consumers`). Browsers never query the database for it.

A rollout button queues the action's Celery task (as the REST API does) and notes the task
in ``{ns}:dash:tasks`` (:func:`task_note`); the control document reports each noted task's
state from Celery's result backend: queued, running, done, or refused with the service's
message.
"""

from __future__ import annotations

import time
from typing import Any, Final

import msgspec
import redis
from celery.result import AsyncResult
from channels.db import database_sync_to_async
from django.core.exceptions import ValidationError

from frontend.rollout_panels import rollout_view, rollouts_recent
from frontend.scaling_panels import scaling_view
from runtime import contract
from runtime.redis_conn import sync_client

STAFF_GROUP: Final = "dashboard.staff"
CONTROL_TTL_S: Final = 10
TASKS_KEPT: Final = 50
TASK_SHOWN_S: Final = 600.0
STATES: Final = {
    "PENDING": "queued",
    "RECEIVED": "queued",
    "STARTED": "running",
    "RETRY": "running",
    "SUCCESS": "done",
    "FAILURE": "refused",
    "REVOKED": "revoked",
}


def control_key(namespace: str) -> str:
    """The latest control document (a string with a TTL)."""
    return contract.live_control_key(namespace)


def tasks_key(namespace: str) -> str:
    """The dashboard's recently queued actions (a capped list, newest first)."""
    return contract.dashboard_tasks_key(namespace)


def task_note(
    client: redis.Redis[bytes],
    namespace: str,
    *,
    task_id: str,
    rollout: int,
    action: str,
    label: str,
) -> None:
    note = {
        "task_id": task_id,
        "rollout": rollout,
        "action": action,
        "label": label,
        "at": time.time(),
    }
    key = tasks_key(namespace)
    pipe = client.pipeline(transaction=False)
    pipe.lpush(key, msgspec.json.encode(note))
    pipe.ltrim(key, 0, TASKS_KEPT - 1)
    pipe.expire(key, int(TASK_SHOWN_S * 2))
    pipe.execute()


def task_error(result: Any) -> str:
    """The refusal's message: a service's ValidationError messages, else the exception."""
    if isinstance(result, ValidationError):
        return "; ".join(result.messages)
    return str(result)


def task_status(task_id: str) -> tuple[str, str]:
    """(queued | running | done | refused | revoked, what it said) from the result backend."""
    result: AsyncResult[Any] = AsyncResult(task_id)
    state = STATES.get(result.state, result.state.lower())
    if state == "refused":
        return state, task_error(result.result)
    if state == "done":
        return state, str(result.result)
    return state, ""


def tasks_view(client: redis.Redis[bytes], namespace: str) -> list[dict[str, Any]]:
    since = time.time() - TASK_SHOWN_S
    views = []
    for raw in client.lrange(tasks_key(namespace), 0, -1):
        note = msgspec.json.decode(raw)
        if note.get("at", 0) < since:
            continue
        state, said = task_status(note["task_id"])
        views.append({**note, "state": state, "said": said})
    return views


def control_document(client: redis.Redis[bytes], namespace: str) -> dict[str, Any]:
    """What operators see change live: rollouts, scaling, the dashboard's queued actions."""
    return {
        "ts": round(time.time(), 3),
        "rollouts": [rollout_view(r, client) for r in rollouts_recent()],
        "scaling": scaling_view(),
        "tasks": tasks_view(client, namespace),
    }


def control_publish(client: redis.Redis[bytes], namespace: str) -> dict[str, Any]:
    """Build the control document and keep it as the latest; returns it."""
    document = control_document(client, namespace)
    client.set(control_key(namespace), msgspec.json.encode(document), ex=CONTROL_TTL_S)
    return document


class ControlSource:
    """The relay's once-a-second build (in a worker thread: the ORM is synchronous)."""

    def __init__(self, redis_url: str, namespace: str) -> None:
        self._redis_url = redis_url
        self._namespace = namespace
        self._client: redis.Redis[bytes] | None = None

    def _build(self) -> dict[str, Any]:
        if self._client is None:
            self._client = sync_client(
                self._redis_url, name="dashboard-control", timeout_s=2.0, connect_timeout_s=1.0
            )
        return control_publish(self._client, self._namespace)

    async def __call__(self) -> dict[str, Any]:
        document: dict[str, Any] = await database_sync_to_async(self._build)()
        return document

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            client.close()
