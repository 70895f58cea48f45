"""Stage ``adapter``: a request for a LoRA adapter has it resident on the granted replica.

A plan whose version is an adapter (``VersionSnap.base_version``) was queued for its base
version's endpoints (:mod:`runtime.routing.table`) with its upstream ``model`` set to the
adapter's engine name (:func:`runtime.snapshot.adapter_name`). Here the granted endpoint's
adapter manager (:class:`runtime.workers.adapter_loader.AdapterFleet`: digest check, LRU with
minimum residency, one load per adapter at a time; slots from the pool's ``max_cpu_loras``)
makes it resident before dispatch, after checking its digest and its signature (the snapshot's
``signing``: required or not, and the trusted keys, as a worker checks a model's). A failed
load is 503 ``adapter_load_failed`` with the reason and Retry-After; every slot pinned by
minimum residency is 429 ``adapter_slots_pinned`` with Retry-After. The request then counts as
*active* on that replica until it ends (the ``adapter_residency`` scorer's stickiest tier, and
the batch's ``max_loras``). Any other request passes.

An engine that restarted at the same URL has lost its adapters. The router learns it from the
replica's heartbeat (a new ``started``, :mod:`runtime.gateway.adapter_heartbeats`); a request
sent before that finds the engine answering 404 for the adapter: :func:`reload_lost_adapter`
(called by the ``dispatch`` stage) forgets it there, loads it again, and the request is sent
once more.
"""

from __future__ import annotations

import math

from runtime.gateway.bundles import UpstreamDeps
from runtime.gateway.errors import ApiError, retry_after
from runtime.gateway.pipeline.context import RequestContext
from runtime.routing.adapters import LoadFailedError
from runtime.snapshot import EndpointSnap, adapter_name
from runtime.upstream.errors import UpstreamHTTPError
from runtime.workers.adapter_loader import AdapterFleet, AllSlotsPinnedError


async def _make_resident(fleet: AdapterFleet, ctx: RequestContext, endpoint: EndpointSnap) -> None:
    """Load the plan's adapter on ``endpoint`` unless resident; the 429 / 503 of a refusal."""
    plan, snapshot = ctx.ready_plan, ctx.ready_snapshot
    settings = fleet.settings(snapshot, endpoint.pool)
    try:
        await fleet.ensure(endpoint, plan.version, settings=settings, signing=snapshot.signing)
    except AllSlotsPinnedError as exc:
        wait = retry_after(math.ceil(exc.retry_after_s))
        raise ApiError.of("adapter_slots_pinned", model=plan.model.name, headers=wait) from None
    except LoadFailedError as exc:
        wait = retry_after(math.ceil(exc.retry_after_s))
        raise ApiError.of(
            "adapter_load_failed", model=plan.model.name, reason=exc.reason, headers=wait
        ) from None


class AdapterResidency:
    name = "adapter"

    def __init__(self, deps: UpstreamDeps) -> None:
        self._fleet = deps.adapters

    async def __call__(self, ctx: RequestContext) -> None:
        plan = ctx.ready_plan
        endpoint = ctx.ready_attempts.grant.endpoint
        if plan.version.base_version is None or endpoint is None:
            return
        await _make_resident(self._fleet, ctx, endpoint)
        # In the engine's batch until the request ends: placement's "active" tier.
        settings = self._fleet.settings(ctx.ready_snapshot, endpoint.pool)
        loader, name = self._fleet.loader(endpoint, settings), adapter_name(plan.version)
        loader.begin(name)
        ctx.hold("adapter", lambda: loader.end(name))


async def reload_lost_adapter(
    fleet: AdapterFleet, ctx: RequestContext, error: UpstreamHTTPError
) -> bool:
    """``error`` is the granted engine's 404 for the plan's adapter, which the router believed
    resident there (the engine restarted and lost it): forget it there and load it again. True
    when the caller may send the request once more; raises the stage's 429 / 503 when the load
    is refused. False for any other error."""
    plan = ctx.ready_plan
    endpoint = ctx.ready_attempts.grant.endpoint
    if (
        plan.version.base_version is None
        or endpoint is None
        or error.status != 404
        or error.endpoint_id != endpoint.id
    ):
        return False
    fleet.lost(endpoint, adapter_name(plan.version))
    await _make_resident(fleet, ctx, endpoint)
    return True
