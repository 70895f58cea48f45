"""Shared helpers for the escrow tests: a fresh key prefix, RedisLimits factories, reads."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest_asyncio
import redis

from runtime.admission.credits import CreditAsk
from runtime.admission.limits import Quota
from runtime.admission.redis_limits import RedisLimits
from runtime.contract import credit_key, escrow_key, period_fields

QUOTA = Quota(rpm=100_000, tpm=1_000_000_000, concurrency=10_000)


def redis_url() -> str:
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def ask(need_uc: int, **kwargs: object) -> CreditAsk:
    day, month = period_fields()
    return CreditAsk(need_uc=need_uc, day_field=day, month_field=month, **kwargs)  # type: ignore[arg-type]


@dataclass
class Bank:
    """One isolated key space: its prefix, stream and a sync client to inspect it."""

    prefix: str
    stream: str
    client: redis.Redis[bytes]
    made: list[RedisLimits] = field(default_factory=list)

    def limits(self, url: str | None = None, **kwargs: object) -> RedisLimits:
        made = RedisLimits(url or redis_url(), prefix=self.prefix, usage_stream=self.stream,
                           **kwargs)  # type: ignore[arg-type]  # fmt: skip
        self.made.append(made)
        return made

    def fund(self, tenant: str, micro: int) -> None:
        self.client.hincrby(credit_key(self.prefix, tenant), "balance", micro)

    def state(self, tenant: str) -> dict[str, int]:
        raw = self.client.hgetall(credit_key(self.prefix, tenant))
        return {k.decode(): int(v) for k, v in raw.items()}

    def balance(self, tenant: str) -> int:
        return self.state(tenant).get("balance", 0)

    def escrow(self, tenant: str) -> int:
        return self.state(tenant).get("escrow", 0)

    def holds(self, tenant: str) -> dict[str, int]:
        raw = self.client.hgetall(escrow_key(self.prefix, tenant))
        return {k.decode(): int(v) for k, v in raw.items()}

    def events(self) -> list[dict[bytes, bytes]]:
        return [fields for _id, fields in self.client.xrange(self.stream)]

    def snapshot_keys(self) -> dict[bytes, object]:
        """Every key of this space with its content (to show a refusal changed nothing)."""
        out: dict[bytes, object] = {}
        for key in sorted(self.client.scan_iter(match=f"{self.prefix}:*")):
            kind = self.client.type(key)
            if kind == b"hash":
                out[key] = self.client.hgetall(key)
            elif kind == b"zset":
                out[key] = self.client.zrange(key, 0, -1)
            else:
                out[key] = kind
        return out


@pytest_asyncio.fixture
async def bank() -> AsyncIterator[Bank]:
    prefix = f"switchyard:test:credits:{uuid.uuid4().hex[:10]}"
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url())
    made = Bank(prefix=prefix, stream=f"{prefix}:usage", client=client)
    yield made
    for limits in made.made:
        await limits.stop()
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


SpoolDir = Callable[[], Path]
