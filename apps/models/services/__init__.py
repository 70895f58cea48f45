"""Writes to the model registry (HackSoft services): every change is audited and republishes
the runtime snapshot after commit. The ``*_validate`` functions hold the rules; the admin forms
call them so bad values show as form errors.

One module per concept; import from here: ``from apps.models.services import model_create``.
"""

from apps.models.services.catalog import (
    model_create,
    model_update,
    model_validate,
    model_version_create,
    model_version_publish,
    model_version_publish_validate,
    model_version_update,
    model_version_update_validate,
    model_version_validate,
)
from apps.models.services.fleet import (
    endpoint_register,
    endpoint_set_state,
    endpoint_transition_validate,
    endpoint_validate,
    pool_create,
    pool_update,
    pool_validate,
)
from apps.models.services.reaper import endpoints_reap_stale
from apps.models.services.routes import route_set, route_validate

__all__ = [
    "endpoint_register",
    "endpoint_set_state",
    "endpoint_transition_validate",
    "endpoint_validate",
    "endpoints_reap_stale",
    "model_create",
    "model_update",
    "model_validate",
    "model_version_create",
    "model_version_publish",
    "model_version_publish_validate",
    "model_version_update",
    "model_version_update_validate",
    "model_version_validate",
    "pool_create",
    "pool_update",
    "pool_validate",
    "route_set",
    "route_validate",
]
