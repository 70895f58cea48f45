"""The Celery application; Redis is the broker and the result backend."""

import os
from typing import Any

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

app = Celery("switchyard")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@signals.worker_init.connect
def _refuse_without_secret_key(**_kwargs: Any) -> None:
    """Worker start without SECRET_KEY outside DEBUG: exit naming it (a plain exception would
    only be logged by the signal; beat checks the same in config.beat_lock)."""
    from django.core.exceptions import ImproperlyConfigured  # noqa: PLC0415

    from config import secret_key  # noqa: PLC0415

    try:
        secret_key.require()
    except ImproperlyConfigured as exc:
        raise SystemExit(f"celery worker: {exc}") from None
