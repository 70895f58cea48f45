"""The dashboard's websocket: live documents for the signed-in user, backfill on connect.

``/ws/live/`` (optionally ``?tenant=<slug>``). The Django session authenticates (Channels'
``AuthMiddlewareStack``); anonymous users are refused (accepted, then closed with 4401 so
the browser can tell), and so is a request for a tenant the user may not watch (4403),
whether in the query string or in a later ``{"subscribe": "<slug>"}`` message. On accept
the consumer sends ``{"type": "backfill", "docs": [...]}`` (the routers' recent documents
from Redis, oldest first), then one
``{"type": "live", "doc": ...}`` per router per second, each cut down by
:func:`frontend.access.filter_document`. Staff also join the staff group: on accept the latest
``{"type": "control", "doc": ...}`` (rollouts, scaling, queued actions:
:mod:`frontend.control_feed`), then one a second. Nobody else ever gets a control document.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs

import msgspec
import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from frontend.access import ALL, filter_document, may_watch, visible_tenants
from frontend.control_feed import STAFF_GROUP, control_key
from frontend.relay import GROUP, backlog_key, live_namespace
from runtime.redis_conn import async_client

BACKFILL_S = 600.0  # what the charts keep
CLOSE_UNAUTHENTICATED = 4401
CLOSE_FORBIDDEN = 4403


def _client(name: str) -> aioredis.Redis[bytes]:
    """A short-lived client for one read on connect (bounded: a slow Redis delays the page by
    at most a few seconds, never forever)."""
    return async_client(settings.REDIS_URL, name=name, timeout_s=2.0, connect_timeout_s=1.0)


class LiveConsumer(AsyncJsonWebsocketConsumer):  # type: ignore[misc]
    visible: frozenset[str] | None
    tenant: str = ""

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self._refuse(CLOSE_UNAUTHENTICATED)
            return
        self.visible = await database_sync_to_async(visible_tenants)(user)
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        self.tenant = (query.get("tenant") or [""])[0]
        if self.visible == frozenset() or (
            self.tenant and not may_watch(self.visible, self.tenant)
        ):
            await self._refuse(CLOSE_FORBIDDEN)
            return
        await self.accept()
        await self.channel_layer.group_add(GROUP, self.channel_name)
        await self.send_json({"type": "backfill", "docs": await self._backfill()})
        if self.visible is ALL:
            await self.channel_layer.group_add(STAFF_GROUP, self.channel_name)
            latest = await self._latest_control()
            if latest is not None:
                await self.send_json({"type": "control", "doc": latest})

    async def _refuse(self, code: int) -> None:
        """Accept, then close with ``code``: a browser sees the code (a refused handshake
        shows only 1006), and nothing is sent before the close."""
        await self.accept()
        await self.close(code=code)

    async def disconnect(self, code: int) -> None:
        if self.channel_layer is not None:
            await self.channel_layer.group_discard(GROUP, self.channel_name)
            await self.channel_layer.group_discard(STAFF_GROUP, self.channel_name)

    async def receive_json(self, content: Any, **kwargs: Any) -> None:
        tenant = content.get("subscribe") if isinstance(content, dict) else None
        if not isinstance(tenant, str) or not may_watch(self.visible, tenant):
            await self.send_json({"type": "error", "error": "forbidden"})
            await self.close(code=CLOSE_FORBIDDEN)
            return
        self.tenant = tenant
        await self.send_json({"type": "backfill", "docs": await self._backfill()})

    async def live_doc(self, event: dict[str, Any]) -> None:
        await self.send_json(
            {"type": "live", "doc": filter_document(event["doc"], self.visible, self.tenant)}
        )

    async def control_doc(self, event: dict[str, Any]) -> None:
        if getattr(self, "visible", frozenset()) is ALL:  # only staff joined; checked again
            await self.send_json({"type": "control", "doc": event["doc"]})

    async def _latest_control(self) -> dict[str, Any] | None:
        client = _client("dashboard-control-read")
        try:
            raw = await client.get(control_key(live_namespace()))
        finally:
            await client.aclose()  # type: ignore[attr-defined]
        return None if raw is None else msgspec.json.decode(raw)

    async def _backfill(self) -> list[dict[str, Any]]:
        client = _client("dashboard-backfill")
        try:
            raw = await client.lrange(backlog_key(), 0, -1)
        finally:
            await client.aclose()  # type: ignore[attr-defined]
        since = time.time() - BACKFILL_S
        docs = [msgspec.json.decode(item) for item in reversed(raw)]
        return [
            filter_document(doc, self.visible, self.tenant)
            for doc in docs
            if doc.get("ts", 0) >= since
        ]
