"""The validation idiom every app's services share (pure, no database access but
:func:`exists_other`).

Services hold the rules in ``*_validate`` functions that raise one ``ValidationError`` keyed by
field (:func:`raise_if`); admin forms and REST serializers call the same functions, so a bad
value shows as a form error, a DRF 400 or a service error with the same words.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError
from django.db.models import QuerySet

_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_RE = re.compile(rf"^(?=.{{1,253}}$){_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?$")


def is_int(value: object) -> bool:
    """True for real integers (``bool`` is not an integer here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def decimal_error(value: object, *, max_digits: int, decimal_places: int) -> str | None:
    """None when ``value`` is a finite non-negative decimal that fits the column."""
    number = to_decimal(value)
    if number is None:
        return "Must be a number."
    if number < 0:
        return "Must not be negative."
    return fits_error(number, max_digits=max_digits, decimal_places=decimal_places)


def fits_error(number: Decimal, *, max_digits: int, decimal_places: int) -> str | None:
    exponent = number.as_tuple().exponent
    if isinstance(exponent, int) and -exponent > decimal_places:
        return f"At most {decimal_places} decimal places."
    if abs(number) >= Decimal(10) ** (max_digits - decimal_places):
        return f"At most {max_digits - decimal_places} digits before the decimal point."
    return None


def to_decimal(value: object) -> Decimal | None:
    """``value`` as a finite Decimal, or None (floats go through ``str`` to avoid binary noise)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        value = str(value)
    try:
        number = Decimal(value)  # type: ignore[arg-type]
    except (InvalidOperation, TypeError, ValueError):
        return None
    return number if number.is_finite() else None


def float_error(value: object, *, minimum: float, strict: bool = False) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return "Must be a number."
    if (strict and value <= minimum) or value < minimum:
        return f"Must be greater than {minimum}." if strict else f"Must be at least {minimum}."
    return None


def http_url_error(url: object) -> str | None:
    """None for an http(s) base URL with a host (single-label names such as a Kubernetes
    service ``http://vllm-0:8000`` included), no query and no fragment."""
    message = "Enter an http(s) URL with a host, e.g. http://10.0.0.5:8000."
    if not isinstance(url, str) or len(url) > 300 or any(c.isspace() for c in url):
        return message
    parts = urlsplit(url)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    host = parts.hostname or ""
    host_ok = HOST_RE.fullmatch(host) is not None or _is_ip(host)
    if parts.scheme not in {"http", "https"} or not host_ok or not port_ok:
        return message
    if parts.query or parts.fragment or parts.username or parts.password:
        return "The base URL must not carry credentials, a query or a fragment."
    return None


def _is_ip(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def str_map_error(value: object, what: str) -> str | None:
    if not isinstance(value, Mapping):
        return f"{what} must be an object of string to string."
    for key, item in value.items():
        if not isinstance(key, str) or not key or not isinstance(item, str) or not item:
            return f"{what} must map non-empty strings to non-empty strings; bad entry {key!r}."
    return None


def raise_if(errors: Mapping[str, Any]) -> None:
    """Raise one ValidationError keyed by field when any field has an error."""
    found = {field: error for field, error in errors.items() if error}
    if found:
        raise ValidationError(found)


def refuse_unknown(changes: Mapping[str, Any], allowed: Iterable[str]) -> None:
    """Refuse an update that names a field the service does not let change."""
    unknown = sorted(set(changes) - set(allowed))
    if unknown:
        raise ValidationError(dict.fromkeys(unknown, "This field cannot be changed here."))


def exists_other(queryset: QuerySet[Any], exclude_pk: int | None) -> bool:
    """Whether ``queryset`` has a row other than ``exclude_pk`` (the object being edited)."""
    if exclude_pk is not None:
        queryset = queryset.exclude(pk=exclude_pk)
    return queryset.exists()


INT_MAX = 2_147_483_647  # PostgreSQL integer columns


def bool_error(value: object) -> str | None:
    """None for a real boolean (not 0/1, not a string)."""
    return None if isinstance(value, bool) else "Must be true or false."


def int_range_error(value: object, *, minimum: int, maximum: int = INT_MAX) -> str | None:
    """None for a whole number (``bool`` excluded) in [minimum, maximum]."""
    if not is_int(value):
        return "Must be a whole number."
    assert isinstance(value, int)
    if value < minimum:
        return f"Must be at least {minimum}."
    if value > maximum:
        return f"Must be at most {maximum}."
    return None
