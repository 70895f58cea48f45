"""Celery tasks of autoscaling: build the configured actuator, call the service."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from celery import shared_task
from django.conf import settings

from apps.scaling import services
from apps.scaling.actuators.base import Actuator
from runtime import redis_conn
from runtime.procs import LIFELINE_ENV

ENV_ACTUATOR = "SWITCHYARD_SCALING_ACTUATOR"  # "local" | "kubernetes"; unset: autoscaling off


def replica_log_dir() -> Path:
    """Where the local actuator's replicas write their output (one file per replica)."""
    return Path(settings.VAR_DIR) / "log" / "replicas"


def actuator_from_env() -> Actuator | None:
    kind = os.environ.get(ENV_ACTUATOR, "").strip()
    if kind == "local":
        from apps.scaling.actuators.local import LocalActuator  # noqa: PLC0415

        return LocalActuator(
            redis_url=settings.REDIS_URL,
            namespace=services.scaling_namespace(),
            log_dir=replica_log_dir(),
            # Under `up` (SWITCHYARD_EXIT_WITH_PID set) a replica outlives the Celery process
            # that started it and stops when `up` is gone (runtime.procs.watch_lifeline), so a
            # Celery crash or restart does not take the model down. Elsewhere it dies with that
            # Celery process; the controller starts a replacement if the pool still needs one.
            death_signal=None if os.environ.get(LIFELINE_ENV) else signal.SIGTERM,
        )
    if kind == "kubernetes":
        from apps.scaling.actuators.kubernetes import KubernetesActuator  # noqa: PLC0415

        return KubernetesActuator.from_cluster(
            os.environ.get("KUBECONFIG") or None,
            namespace=os.environ.get("SWITCHYARD_K8S_NAMESPACE", "switchyard"),
        )
    return None


@shared_task(name="apps.scaling.tasks.autoscale_tick", ignore_result=True)
def autoscale_tick() -> int:
    """One controller tick (``CELERY_BEAT_SCHEDULE``); the number of decisions recorded."""
    actuator = actuator_from_env()
    if actuator is None:
        return 0
    client = redis_conn.from_url(settings.REDIS_URL)
    try:
        decisions = services.autoscale_all(
            client=client, actuator=actuator, namespace=services.scaling_namespace()
        )
    finally:
        client.close()
        close = getattr(actuator, "close", None)  # the local actuator's Redis client
        if close is not None:
            close()
    return len(decisions or [])
