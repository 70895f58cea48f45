"""Stage ``adapter``: a request for a LoRA adapter has it resident on the granted replica.

A plan whose version is an adapter (``VersionSnap.base_version``) was queued for its base
version's endpoints (:mod:`runtime.routing.table`) with its upstream ``model`` set to the
adapter's engine name (:func:`runtime.snapshot.adapter_name`). Here the granted endpoint's
adapter manager (:class:`runtime.workers.adapter_loader.AdapterFleet`: digest check, LRU with
minimum residency, one load per adapter at a time) makes it resident before dispatch. A failed
load is 503 ``adapter_load_failed`` with the reason and Retry-After; every slot pinned by
minimum residency is 429 ``adapter_slots_pinned`` with Retry-After. Any other request passes.
"""

from __future__ import annotations

import math

from runtime.gateway.bundles import UpstreamDeps
from runtime.gateway.errors import ApiError, retry_after
from runtime.gateway.pipeline.context import RequestContext
from runtime.routing.adapters import LoadFailedError
from runtime.workers.adapter_loader import AllSlotsPinnedError


class AdapterResidency:
    name = "adapter"

    def __init__(self, deps: UpstreamDeps) -> None:
        self._fleet = deps.adapters

    async def __call__(self, ctx: RequestContext) -> None:
        plan = ctx.ready_plan
        endpoint = ctx.ready_attempts.grant.endpoint
        if plan.version.base_version is None or endpoint is None:
            return
        try:
            await self._fleet.ensure(endpoint, plan.version)
        except AllSlotsPinnedError as exc:
            wait = retry_after(math.ceil(exc.retry_after_s))
            raise ApiError.of("adapter_slots_pinned", model=plan.model.name, headers=wait) from None
        except LoadFailedError as exc:
            wait = retry_after(math.ceil(exc.retry_after_s))
            raise ApiError.of(
                "adapter_load_failed", model=plan.model.name, reason=exc.reason, headers=wait
            ) from None
