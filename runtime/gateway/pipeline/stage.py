"""The stage protocol and the runner of an ordered stage list.

A stage is an object with a ``name`` and an ``async __call__(ctx)``: it reads what earlier
stages put in the :class:`~runtime.gateway.pipeline.context.RequestContext`, adds its own
decision, and registers on the context whatever it acquired that must be given back. It ends
the request early by raising an ``ApiError`` (a refusal) or by answering and setting
``ctx.answered`` (a cache hit, an idempotent replay, a coalesced unary reply); it asks for the
rest to run without the client by setting ``ctx.detach`` (the first request of an
``Idempotency-Key``). Adding a stage is one module plus one line in
:func:`runtime.gateway.pipeline.build.inference_stages`.

:class:`Pipeline` runs the stages in order inside the context's exit stack, so every
registered release runs exactly once, whichever way the request ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Sequence
from typing import Any, Protocol

from runtime.gateway.pipeline.context import RequestContext


class Stage(Protocol):
    """One step of the request path."""

    @property
    def name(self) -> str: ...

    async def __call__(self, ctx: RequestContext) -> None: ...


class Pipeline:
    """An ordered list of stages, run per request."""

    __slots__ = ("stages",)

    def __init__(self, stages: Sequence[Stage]) -> None:
        names = [stage.name for stage in stages]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names repeat: {names}")
        self.stages = tuple(stages)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(stage.name for stage in self.stages)

    def run(self, ctx: RequestContext) -> Coroutine[Any, Any, None]:
        """Run every stage until one answers or raises; then the context's releases (the
        runner's own coroutine, not one wrapping it: one frame fewer on every resume of the
        request's task, issue #27)."""
        return self._run_from(ctx, 0)

    async def _run_from(self, ctx: RequestContext, start: int) -> None:
        async with ctx.exits:
            for index in range(start, len(self.stages)):
                if ctx.answered:
                    return
                await self.stages[index](ctx)
                if ctx.detach:  # the rest (and the releases) outlive the client's task
                    ctx.detach = False
                    ctx.exits = ctx.exits.pop_all()
                    rest = asyncio.ensure_future(self._run_from(ctx, index + 1))
                    await asyncio.shield(rest)
                    return
