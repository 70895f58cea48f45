"""API-key authentication against the snapshot, and off-path recording of key use.

A key is ``"sy_" + prefix (8 of [a-z0-9]) + "_" + secret (40 of [A-Za-z0-9])``
(:mod:`runtime.contract`); the snapshot holds its prefix and the sha256 hex digest of the
whole key (:func:`runtime.contract.api_key_digest`, which the control plane stores too). The
prefix finds the record; the digest is compared with :func:`hmac.compare_digest`. An unknown
prefix is compared against a dummy digest, so both paths do the same work. Revoked keys are not
in the snapshot and read as unknown. The tenant comes from the key record only.

:class:`PrincipalCache` keeps the principals of the ``Authorization`` headers that
authenticated against the snapshot in force (a new snapshot starts it afresh; a refusal is
never kept), so a known key costs one dict lookup and its expiry check instead of the parse,
the digest and the lookups (issue #27).
"""

from __future__ import annotations

import hmac

import msgspec

from runtime.contract import api_key_digest, api_key_prefix
from runtime.gateway.errors import ApiError
from runtime.snapshot import ApiKeySnap, Snapshot, TenantSnap

INFERENCE_SCOPE = "inference"
PRINCIPALS_KEPT = 4096  # per snapshot; a full cache starts again
# sha256("switchyard: no such key"): compared against when the prefix is unknown.
_DUMMY_DIGEST = "906289093200296f34abfe4123d8bc964ae14229f3c74df74ce5508c756dc6f7"


class Principal(msgspec.Struct, frozen=True):
    key: ApiKeySnap
    tenant: TenantSnap


def bearer_token(authorization: bytes | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; 401 when absent."""
    if not authorization:
        raise ApiError.of(
            "missing_api_key",
            reason="You didn't provide an API key. Send it as 'Authorization: Bearer <key>'.",
        )
    scheme, _, token = authorization.decode("latin-1").strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token:
        raise ApiError.of(
            "missing_api_key",
            reason="The Authorization header must be 'Bearer <key>'.",
        )
    return token


def authenticate(snapshot: Snapshot, token: str, *, now: float) -> Principal:
    """The key's record and tenant, or ApiError 401/403. ``now`` is unix seconds."""
    prefix = api_key_prefix(token)
    record = snapshot.api_keys.get(prefix) if prefix is not None else None
    presented = api_key_digest(token)
    expected = record.digest if record is not None else _DUMMY_DIGEST
    if not hmac.compare_digest(presented, expected) or record is None:
        raise ApiError.of("invalid_api_key")
    if record.expires_at is not None and now >= record.expires_at:
        raise ApiError.of("expired_api_key")
    tenant = snapshot.tenants.get(record.tenant)
    if tenant is None:
        raise ApiError.of("invalid_api_key")
    if tenant.status != "active":
        raise ApiError.of("tenant_suspended", state=tenant.status)
    if INFERENCE_SCOPE not in record.scopes:
        raise ApiError.of("insufficient_scope", scope=INFERENCE_SCOPE)
    return Principal(record, tenant)


class PrincipalCache:
    """The principals of the ``Authorization`` headers that authenticated against one
    snapshot; :meth:`principal` is :func:`authenticate` of the header's bearer token."""

    __slots__ = ("_limit", "_principals", "_snapshot")

    def __init__(self, limit: int = PRINCIPALS_KEPT) -> None:
        self._limit = limit
        self._snapshot: Snapshot | None = None
        self._principals: dict[bytes, Principal] = {}

    def principal(
        self, snapshot: Snapshot, authorization: bytes | None, *, now: float
    ) -> Principal:
        """The header's principal, or ApiError 401/403 (as :func:`authenticate`)."""
        if snapshot is not self._snapshot:
            self._snapshot, self._principals = snapshot, {}
        principal = self._principals.get(authorization) if authorization else None
        if principal is None:
            principal = authenticate(snapshot, bearer_token(authorization), now=now)
            if len(self._principals) >= self._limit:
                self._principals.clear()
            self._principals[bytes(authorization or b"")] = principal
            return principal
        expires_at = principal.key.expires_at
        if expires_at is not None and now >= expires_at:
            raise ApiError.of("expired_api_key")
        return principal
