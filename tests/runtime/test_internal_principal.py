"""runtime.internal_principal: the principal the router signs for the control plane; forged,
replayed on another path, expired, malformed or unsigned headers are refused."""

from __future__ import annotations

import pytest

from runtime.internal_principal import MAX_AGE_S, PrincipalRefusedError, sign, verify

pytestmark = pytest.mark.unit

SECRET = "s3cret"
NOW = 1_800_000_000.0


def _signed(**overrides: object) -> str:
    args: dict[str, object] = {"method": "POST", "path": "/v1/batches", "tenant": "acme",
                               "key_prefix": "abcd1234", "now": NOW} | overrides  # fmt: skip
    return sign(SECRET, **args)  # type: ignore[arg-type]


def test_a_signed_principal_verifies() -> None:
    principal = verify(SECRET, _signed(), method="POST", path="/v1/batches", now=NOW + 5)
    assert (principal.tenant, principal.key_prefix, principal.signed_at) == (
        "acme", "abcd1234", int(NOW),
    )  # fmt: skip


@pytest.mark.parametrize(
    ("value", "secret", "method", "path", "now", "reason"),
    [
        (None, SECRET, "POST", "/v1/batches", NOW, "no signed principal"),
        ("v1:garbage", SECRET, "POST", "/v1/batches", NOW, "malformed"),
        (_signed(), "other", "POST", "/v1/batches", NOW, "does not verify"),
        (_signed(), SECRET, "GET", "/v1/batches", NOW, "does not verify"),
        (_signed(), SECRET, "POST", "/v1/files", NOW, "does not verify"),
        (_signed(), SECRET, "POST", "/v1/batches", NOW + MAX_AGE_S + 1, "expired"),
        (_signed(), "", "POST", "/v1/batches", NOW, "no internal secret"),
    ],
)
def test_refusals(
    value: str | None, secret: str, method: str, path: str, now: float, reason: str
) -> None:
    with pytest.raises(PrincipalRefusedError, match=reason):
        verify(secret, value, method=method, path=path, now=now)


def test_another_tenant_in_a_signed_header_does_not_verify() -> None:
    forged = _signed().replace(":acme:", ":evil:")
    with pytest.raises(PrincipalRefusedError, match="does not verify"):
        verify(SECRET, forged, method="POST", path="/v1/batches", now=NOW)


def test_a_batch_line_mark_verifies_for_its_tenant_only() -> None:
    from runtime.internal_principal import line_event_id, sign_line, verify_line  # noqa: PLC0415

    mark = sign_line(SECRET, tenant="acme", ref="123", now=NOW)
    assert verify_line(SECRET, mark, tenant="acme", now=NOW + 5) == "123"
    assert line_event_id("123") == "batch-line-123"
    refusals = [
        (SECRET, mark, "other", NOW, "another tenant"),
        ("other-secret", mark, "acme", NOW, "does not verify"),
        (SECRET, mark.replace(":123:", ":124:"), "acme", NOW, "does not verify"),
        (SECRET, mark, "acme", NOW + MAX_AGE_S + 1, "expired"),
        (SECRET, "v1:garbage", "acme", NOW, "malformed"),
        ("", mark, "acme", NOW, "no internal secret"),
    ]
    for secret, value, tenant, now, reason in refusals:
        with pytest.raises(PrincipalRefusedError, match=reason):
            verify_line(secret, value, tenant=tenant, now=now)
