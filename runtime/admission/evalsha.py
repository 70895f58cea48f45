"""Lua scripts run by SHA in one pipeline (what :class:`~.redis_limits.RedisLimits` writes
with): EVALSHA only, loading a script Redis forgot (restarted, flushed) and running its
calls again."""

from __future__ import annotations

from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError


async def pipelined(
    client: aioredis.Redis[bytes],
    script: Any,
    source: str,
    calls: list[tuple[list[str], list[Any]]],
) -> None:
    """Run ``script`` once per call in one pipeline (EVALSHA only: redis-py's script
    objects would add a SCRIPT EXISTS round trip to every pipeline); loads the script
    and retries once if the server does not know it (restarted, flushed)."""
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for keys, args in calls:
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        try:
            await pipe.execute()
        except NoScriptError:
            if attempt:
                raise
            await client.script_load(source)  # type: ignore[no-untyped-call]
        else:
            return


async def evaluate(
    client: aioredis.Redis[bytes], calls: list[tuple[Any, str, list[str], list[Any]]]
) -> list[Any]:
    """Run scripts in one pipeline and return their answers; a script Redis forgot is
    loaded and its calls run again (a grant twice: the same entries and slots, its
    tokens debited twice, which errs on the safe side)."""
    answers: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for i in todo:
            script, _, keys, args = calls[i]
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        results = await pipe.execute(raise_on_error=False)
        missing = []
        for i, result in zip(todo, results, strict=True):
            if isinstance(result, NoScriptError) and not attempt:
                missing.append(i)
            elif isinstance(result, Exception):
                raise result
            else:
                answers[i] = result
        if not missing:
            break
        for source in {calls[i][1] for i in missing}:
            await client.script_load(source)  # type: ignore[no-untyped-call]
        todo = missing
    return answers
