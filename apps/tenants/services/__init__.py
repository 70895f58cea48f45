"""Every write of the tenants app (HackSoft style: keyword-only, typed, `<noun>_<verb>`).

One module per concept; this package re-exports the public services so callers import
`apps.tenants.services`. The `*_validate_values` functions hold the value rules once: the
services call them, and so do the admin forms, so an invalid value shows as a form error.
"""

from apps.tenants.services.api_keys import (
    API_KEY_SCOPES,
    api_key_create,
    api_key_digest,
    api_key_revoke,
    api_key_touch,
    api_key_validate_values,
)
from apps.tenants.services.key_usage import api_key_usage_sync
from apps.tenants.services.memberships import (
    membership_create,
    membership_delete,
    membership_update_role,
    membership_validate_values,
)
from apps.tenants.services.request_classes import (
    REQUEST_CLASS_FIELDS,
    request_class_create,
    request_class_update,
    request_class_validate_values,
)
from apps.tenants.services.tenants import (
    TENANT_LIMIT_FIELDS,
    TENANT_UPDATABLE_FIELDS,
    tenant_activate,
    tenant_create,
    tenant_suspend,
    tenant_update,
    tenant_validate_values,
)

__all__ = [
    "API_KEY_SCOPES",
    "REQUEST_CLASS_FIELDS",
    "TENANT_LIMIT_FIELDS",
    "TENANT_UPDATABLE_FIELDS",
    "api_key_create",
    "api_key_digest",
    "api_key_revoke",
    "api_key_touch",
    "api_key_usage_sync",
    "api_key_validate_values",
    "membership_create",
    "membership_delete",
    "membership_update_role",
    "membership_validate_values",
    "request_class_create",
    "request_class_update",
    "request_class_validate_values",
    "tenant_activate",
    "tenant_create",
    "tenant_suspend",
    "tenant_update",
    "tenant_validate_values",
]
