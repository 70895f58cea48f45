"""After a rollback, an abort or a cancel: drain the candidate replicas the warm-up started.

:func:`apps.rollouts.transitions.rollout_rollback` queues :func:`rollout_drain_candidate` once
its transaction commits; the task lives here, below the transitions, so they need no deferred
import of the tasks module.
"""

from __future__ import annotations

from celery import shared_task

from apps.models.models import Endpoint
from apps.models.services.fleet import endpoint_set_state
from apps.rollouts.models import Rollout
from apps.rollouts.services import _event
from apps.scaling.tasks import actuator_from_env


def candidate_drain(*, rollout: Rollout) -> list[int]:
    """Drain and stop the candidate replicas the warm-up started (after a rollback, an abort or
    a cancel); the ids drained. Endpoints nobody here started, and stable's, are left alone."""
    rollout.refresh_from_db()
    if rollout.state not in (
        Rollout.State.ROLLED_BACK,
        Rollout.State.ABORTED,
        Rollout.State.CANCELLED,
    ):
        return []
    endpoints = list(
        Endpoint.objects.select_related("pool")
        .filter(pk__in=list(rollout.warmup_endpoints), version=rollout.candidate_version)
        .exclude(state=Endpoint.State.GONE)
    )
    if not endpoints:
        return []
    actuator = actuator_from_env()
    drain = getattr(actuator, "drain", None)
    drained: list[int] = []
    for endpoint in endpoints:
        if drain is None:  # nothing here can stop it: at least take it out of the routers
            if endpoint.state == Endpoint.State.READY:
                endpoint_set_state(actor=None, endpoint=endpoint, state=Endpoint.State.DRAINING)
        else:
            drain(endpoint.pool, endpoint)
        drained.append(endpoint.pk)
    how = "stopped by the actuator" if drain is not None else "unrouted (no actuator to stop it)"
    _event(
        rollout,
        actor=None,
        kind="drain",
        from_state=rollout.state,
        reason=f"Candidate replicas drained: {how}.",
        data={"endpoints": drained},
    )
    return drained


@shared_task(name="apps.rollouts.tasks.rollout_drain_candidate")
def rollout_drain_candidate(*, rollout_id: int) -> list[int]:
    """After a rollback: drain and stop the candidate replicas the warm-up started."""
    return candidate_drain(rollout=Rollout.objects.get(pk=rollout_id))
