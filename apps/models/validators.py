"""Pure validation rules of the model registry (no database access).

The services in :mod:`apps.models.services` call these and raise ``ValidationError``; the admin
forms reach them through the services' ``*_validate`` functions.
"""

from __future__ import annotations

import ipaddress
import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import urlsplit

from django.core.exceptions import ValidationError

from runtime.pool_policies import pool_policy_errors

# OpenAI-style model ids: "tiny-llama", "all-MiniLM-L6-v2", "org/name-7b".
MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._/-]{0,98}[A-Za-z0-9])?$")
LABEL_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,62}[A-Za-z0-9])?$")
POOL_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")
TIER_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_HOST_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
HOST_RE = re.compile(rf"^(?=.{{1,253}}$){_HOST_LABEL}(?:\.{_HOST_LABEL})*\.?$")

MANIFEST_KEYS = ("tokenizer", "max_context", "default_sampling", "files")


def is_sha256(value: object) -> bool:
    return isinstance(value, str) and SHA256_RE.fullmatch(value) is not None


def is_int(value: object) -> bool:
    """True for real integers (``bool`` is not an integer here)."""
    return isinstance(value, int) and not isinstance(value, bool)


def model_name_error(name: object) -> str | None:
    if not isinstance(name, str) or not MODEL_NAME_RE.fullmatch(name):
        return (
            "Model name must be 1-100 characters of letters, digits, '.', '_', '-' or '/', "
            "starting and ending with a letter or digit."
        )
    if "//" in name:
        return "Model name must not contain '//'."
    return None


REQUEST_FIELD_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
# The router reads these to route and meter; refusing them would refuse every request.
ROUTER_FIELDS = frozenset({"model", "messages", "prompt", "input"})


def refused_fields_error(fields: object) -> str | None:
    """A model's refused request fields: a list of distinct top-level field names."""
    if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
        return 'Refused fields must be a JSON list of field names, e.g. ["logit_bias"].'
    bad = [f for f in fields if not REQUEST_FIELD_RE.fullmatch(f)]
    if bad:
        return f"Not a request field name: {', '.join(map(repr, bad))}."
    if len(set(fields)) != len(fields):
        return "Refused fields must not repeat."
    essential = sorted(ROUTER_FIELDS.intersection(fields))
    if essential:
        return f"The router needs {', '.join(essential)}; it cannot be refused."
    return None


def label_error(label: object) -> str | None:
    if not isinstance(label, str) or not LABEL_RE.fullmatch(label):
        return (
            "Label must be 1-64 characters of letters, digits, '.', '_' or '-', "
            "starting and ending with a letter or digit."
        )
    return None


def manifest_errors(manifest: object, *, complete: bool) -> list[str]:
    """Problems with a version manifest.

    ``complete=False`` (a draft) checks only the keys that are present; ``complete=True``
    (publishing) also requires every key in :data:`MANIFEST_KEYS`.
    """
    if not isinstance(manifest, Mapping):
        return ["Manifest must be a JSON object."]
    errors: list[str] = []
    if complete:
        missing = [key for key in MANIFEST_KEYS if key not in manifest]
        if missing:
            errors.append(f"Manifest is missing required key(s): {', '.join(missing)}.")
    if "tokenizer" in manifest:
        tokenizer = manifest["tokenizer"]
        if not isinstance(tokenizer, str) or not tokenizer.strip():
            errors.append("Manifest 'tokenizer' must be a non-empty string.")
    if "max_context" in manifest:
        max_context = manifest["max_context"]
        if not is_int(max_context) or max_context <= 0:
            errors.append("Manifest 'max_context' must be a positive integer.")
    if "default_sampling" in manifest and not isinstance(manifest["default_sampling"], Mapping):
        errors.append("Manifest 'default_sampling' must be an object.")
    if "files" in manifest:
        errors.extend(_manifest_files_errors(manifest["files"]))
    return errors


def _manifest_files_errors(files: object) -> list[str]:
    if not isinstance(files, Mapping):
        return ["Manifest 'files' must be an object mapping relative paths to sha256 digests."]
    errors: list[str] = []
    for path, digest in files.items():
        if not isinstance(path, str) or not path or path.startswith("/") or ".." in path.split("/"):
            errors.append(
                f"Manifest file path {path!r} must be a relative path inside the artifact."
            )
        if not is_sha256(digest):
            errors.append(
                f"Manifest file {path!r} needs a sha256 digest of 64 lowercase hex digits."
            )
    return errors


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


def pool_policies_error(policies: object) -> str | None:
    """None when ``policies`` is a string map the router uses as written: every key known and
    every name and parameter accepted by the runtime's registries (:mod:`runtime.pool_policies`).
    """
    shape_error = str_map_error(policies, "Policies")
    if shape_error is not None or not isinstance(policies, Mapping):
        return shape_error
    errors = pool_policy_errors(policies)
    return " ".join(errors) if errors else None


def raise_if(errors: Mapping[str, Any]) -> None:
    """Raise one ValidationError keyed by field when any field has an error."""
    found = {field: error for field, error in errors.items() if error}
    if found:
        raise ValidationError(found)
