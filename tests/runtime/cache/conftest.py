"""A real Redis client for the cache tests; the keys under the test module's ``NS`` (when it
names one) are deleted after each test."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis.asyncio as aioredis


@pytest_asyncio.fixture
async def client(request: pytest.FixtureRequest) -> AsyncIterator[aioredis.Redis[bytes]]:
    redis = aioredis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    yield redis
    namespace = getattr(request.module, "NS", None)
    if namespace is not None:
        keys = [k async for k in redis.scan_iter(match=f"{namespace}:*")]
        if keys:
            await redis.delete(*keys)
    await redis.aclose()  # type: ignore[attr-defined]
