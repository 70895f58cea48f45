"""Stage ``authenticate``: the snapshot in force, the API key, the tenant's own size cap."""

from __future__ import annotations

import time
from collections.abc import Callable

from runtime.gateway.auth import PrincipalCache
from runtime.gateway.errors import NO_SNAPSHOT, ApiError
from runtime.gateway.key_usage import KeyUsageRecorder
from runtime.gateway.pipeline.context import RequestContext
from runtime.snapshot import Snapshot


class Authenticate:
    name = "authenticate"

    def __init__(
        self, snapshot: Callable[[], Snapshot | None], key_usage: KeyUsageRecorder
    ) -> None:
        self._snapshot = snapshot
        self._key_usage = key_usage
        self._principals = PrincipalCache()

    async def __call__(self, ctx: RequestContext) -> None:
        snapshot = self._snapshot()
        if snapshot is None:
            raise ApiError.of("not_ready", reason=NO_SNAPSHOT)
        ctx.snapshot = snapshot
        record = ctx.record
        started = time.perf_counter()
        now = time.time()
        try:
            principal = self._principals.principal(snapshot, ctx.headers(b"authorization"), now=now)
        finally:
            record.timing("auth", time.perf_counter() - started)
        ctx.principal = principal
        record.tenant, record.api_key = principal.tenant.slug, principal.key.prefix
        cap = principal.tenant.max_request_bytes
        if 0 < cap < len(ctx.body):  # the tenant's own size cap
            raise ApiError.of("request_too_large", cap=cap)
        self._key_usage.record(principal.key.prefix, now)
