"""``manage.py stop_replicas``: stop every replica the local actuator started on this machine.

``switchyard up`` runs it when it stops (after the Celery worker, before the embedded servers)
and when it starts (replicas a killed ``up`` left behind): each replica gets SIGTERM (a real
worker drains and stops its engine), SIGKILL after its grace, and its endpoint goes ``gone``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand

from apps.scaling.actuators.local import LocalActuator
from apps.scaling.services import local_replicas_stop_all, scaling_namespace
from apps.scaling.tasks import replica_log_dir


class Command(BaseCommand):
    help = "Stop every replica the local actuator started (SIGTERM, then SIGKILL); endpoints gone."

    def handle(self, *args: Any, **options: Any) -> None:
        actuator = LocalActuator(
            redis_url=settings.REDIS_URL, namespace=scaling_namespace(), log_dir=replica_log_dir()
        )
        try:
            stopped = local_replicas_stop_all(actuator=actuator)
        finally:
            actuator.close()
        if stopped:
            self.stdout.write(f"stopped {stopped} replica(s) the autoscaler had started")
