"""Small value checks shared by the validators of this package (errors collected per field)."""

from __future__ import annotations

import math
import numbers
import re

# PositiveIntegerField / PositiveSmallIntegerField upper bounds in PostgreSQL.
INT_MAX = 2_147_483_647
SMALLINT_MAX = 32_767

# Lower-case DNS label: letters, digits and inner hyphens, 1-63 characters.
TENANT_SLUG_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
# Request-class names: lower-case, start with a letter, then letters, digits, '-' or '_'.
CLASS_NAME_RE = re.compile(r"^[a-z][a-z0-9_-]{0,39}$")

Errors = dict[str, list[str]]


def add_error(errors: Errors, field: str, message: str) -> None:
    errors.setdefault(field, []).append(message)


def _label(field: str) -> str:
    return field.replace("_", " ").capitalize()


def check_int(
    errors: Errors,
    field: str,
    value: object,
    *,
    minimum: int,
    maximum: int = INT_MAX,
    label: str | None = None,
) -> bool:
    """A whole number in [minimum, maximum]; records an error and returns False otherwise."""
    label = label or _label(field)
    if isinstance(value, bool) or not isinstance(value, int):
        add_error(errors, field, f"{label} must be a whole number (got {value!r}).")
        return False
    if value < minimum:
        kind = "a positive whole number" if minimum == 1 else f"at least {minimum}"
        add_error(errors, field, f"{label} must be {kind} (got {value}).")
        return False
    if value > maximum:
        add_error(errors, field, f"{label} must be at most {maximum} (got {value}).")
        return False
    return True


def check_positive_number(errors: Errors, field: str, value: object) -> bool:
    """A finite real number strictly greater than 0."""
    label = _label(field)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        add_error(errors, field, f"{label} must be a number (got {value!r}).")
        return False
    if not math.isfinite(float(value)) or float(value) <= 0:
        add_error(errors, field, f"{label} must be greater than 0 (got {value}).")
        return False
    return True


def check_text(errors: Errors, field: str, value: object, *, max_length: int) -> bool:
    """A non-blank string of at most `max_length` characters."""
    label = _label(field)
    if not isinstance(value, str) or not value.strip():
        add_error(errors, field, f"{label} must not be blank.")
        return False
    if len(value) > max_length:
        add_error(errors, field, f"{label} must be at most {max_length} characters.")
        return False
    return True
