"""The names ``config/settings.py`` gives DRF and drf-spectacular, until settings name
:mod:`apps.common.api_support` (where the REST conventions live) directly."""

from apps.common.api_support import (
    CredentialThrottle,
    IdCursorPagination,
    api_exception_handler,
    error_responses_hook,
)

__all__ = [
    "CredentialThrottle",
    "IdCursorPagination",
    "api_exception_handler",
    "error_responses_hook",
]
