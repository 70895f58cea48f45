"""The signed principal header the router adds when it forwards a request to the control plane.

The router authenticates the API key against its snapshot and forwards ``/v1/files*`` and
``/v1/batches*`` to the control plane (it never touches PostgreSQL). The control plane must
trust the tenant the router resolved, and only that: the header carries the tenant and the key
prefix, the time it was signed, and an HMAC-SHA256 over those plus the request's method and
path, keyed by a secret both sides share (``SWITCHYARD_INTERNAL_SECRET``). A header that is
missing, malformed, signed with another secret, for another method or path, or older than
:data:`MAX_AGE_S` is refused (:class:`PrincipalRefusedError`).

Format: ``v1:<unix seconds>:<tenant slug>:<key prefix>:<hex digest>``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass
from typing import Final

HEADER: Final = "X-Switchyard-Principal"
VERSION: Final = "v1"
MAX_AGE_S: Final = 60.0
_FORMAT = re.compile(r"v1:(\d{1,12}):([A-Za-z0-9_-]{1,64}):([a-z0-9]{1,16}):([0-9a-f]{64})")


class PrincipalRefusedError(ValueError):
    """The header is absent, malformed, forged or expired (the message says which)."""


@dataclass(frozen=True, slots=True)
class SignedPrincipal:
    tenant: str  # the tenant's slug
    key_prefix: str
    signed_at: int


def _digest(secret: str, *parts: str) -> str:
    message = "\n".join((VERSION, *parts))
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def sign(secret: str, *, method: str, path: str, tenant: str, key_prefix: str, now: float) -> str:
    """The header value for a request ``method path`` on behalf of ``tenant``."""
    if not secret:
        raise PrincipalRefusedError("no internal secret is configured")
    signed_at = int(now)
    digest = _digest(secret, method.upper(), path, str(signed_at), tenant, key_prefix)
    return f"{VERSION}:{signed_at}:{tenant}:{key_prefix}:{digest}"


def verify(
    secret: str, value: str | None, *, method: str, path: str, now: float
) -> SignedPrincipal:
    """The principal of a header value, or :class:`PrincipalRefusedError`."""
    if not secret:
        raise PrincipalRefusedError("no internal secret is configured")
    if not value:
        raise PrincipalRefusedError("the request carries no signed principal")
    match = _FORMAT.fullmatch(value.strip())
    if match is None:
        raise PrincipalRefusedError("the signed principal is malformed")
    signed_at, tenant, key, digest = int(match[1]), match[2], match[3], match[4]
    expected = _digest(secret, method.upper(), path, str(signed_at), tenant, key)
    if not hmac.compare_digest(expected, digest):
        raise PrincipalRefusedError("the signed principal does not verify")
    if abs(now - signed_at) > MAX_AGE_S:
        raise PrincipalRefusedError("the signed principal has expired")
    return SignedPrincipal(tenant=tenant, key_prefix=key, signed_at=signed_at)


# -- a batch line's mark ------------------------------------------------------------------------
# The control plane's batch executor sends each line through the router's public endpoint with
# the batch's own API key, plus this header: the line's ledger reference, signed with the same
# secret for the tenant of the key. The router then admits the line in the tenant's batch lane
# (limits of its own, not the online RPM/TPM/concurrency) and bills it under the usage event id
# ``batch-line-<ref>``, the same on every try of the line (apps/batches/executor.py).

LINE_HEADER: Final = "X-Switchyard-Batch-Line"
_LINE_FORMAT = re.compile(r"v1:(\d{1,12}):([A-Za-z0-9_-]{1,64}):([a-z0-9]{1,32}):([0-9a-f]{64})")
LINE_EVENT_PREFIX: Final = "batch-line-"


def line_event_id(ref: str) -> str:
    """The usage event id (the ledger's unique ``event_id``) of every try of line ``ref``."""
    return f"{LINE_EVENT_PREFIX}{ref}"


def sign_line(secret: str, *, tenant: str, ref: str, now: float) -> str:
    """The header value marking a request as batch line ``ref`` of ``tenant``."""
    if not secret:
        raise PrincipalRefusedError("no internal secret is configured")
    signed_at = int(now)
    digest = _digest(secret, "batch-line", str(signed_at), tenant, ref)
    return f"{VERSION}:{signed_at}:{tenant}:{ref}:{digest}"


def verify_line(secret: str, value: str, *, tenant: str, now: float) -> str:
    """The line reference of a header value signed for ``tenant``, or
    :class:`PrincipalRefusedError`."""
    if not secret:
        raise PrincipalRefusedError("no internal secret is configured")
    match = _LINE_FORMAT.fullmatch(value.strip())
    if match is None:
        raise PrincipalRefusedError("the batch line mark is malformed")
    signed_at, signed_tenant, ref, digest = int(match[1]), match[2], match[3], match[4]
    expected = _digest(secret, "batch-line", str(signed_at), signed_tenant, ref)
    if not hmac.compare_digest(expected, digest):
        raise PrincipalRefusedError("the batch line mark does not verify")
    if signed_tenant != tenant:
        raise PrincipalRefusedError("the batch line mark is for another tenant")
    if abs(now - signed_at) > MAX_AGE_S:
        raise PrincipalRefusedError("the batch line mark has expired")
    return ref
