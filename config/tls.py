"""``switchyard up --tls``: a local CA and one certificate for this machine, kept in the var dir.

:func:`ensure_local_pki` makes ``<var>/tls/`` on the first run and keeps it: ``ca.pem`` (a
self-signed CA, ten years, its key ``ca-key.pem``) and ``server.pem`` / ``server-key.pem``
(``localhost``, ``127.0.0.1``, ``::1``; for serving *and* as the router's client certificate to
the workers, both uses in its extended key usage; 825 days, remade from the kept CA when it ends
within 30 days). Keys are EC P-256 (cheap handshakes), files of keys mode 0600.

:func:`up_environ` turns them into the variables the processes read (:mod:`runtime.tls`): HTTPS
for the router and the control plane, HTTPS with required client certificates for the model
workers, and the router's client side; plus HSTS for an hour on this machine (a year is the
default elsewhere; HSTS for ``localhost`` would otherwise outlive the run for every local port)
and the https origins for CSRF. :func:`trust_lines` is what ``up`` prints about trusting the CA.

Plain Python (``cryptography``); Django only inside :func:`require_serving_cert`.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from runtime import tls

DIR_NAME: Final = "tls"
CA_DAYS: Final = 3650
LEAF_DAYS: Final = 825
RENEW_WITHIN_DAYS: Final = 30
LOCAL_NAMES: Final = ("localhost",)
LOCAL_IPS: Final = ("127.0.0.1", "::1")
UP_HSTS_SECONDS: Final = "3600"


@dataclass(frozen=True, slots=True)
class LocalPKI:
    """The files of ``<var>/tls/``."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca-key.pem"

    @property
    def cert(self) -> Path:
        return self.directory / "server.pem"

    @property
    def key(self) -> Path:
        return self.directory / "server-key.pem"


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(pem)


def _write_cert(path: Path, cert: x509.Certificate) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


CA = tuple[x509.Certificate, ec.EllipticCurvePrivateKey]


def _make_ca(pki: LocalPKI, now: dt.datetime) -> CA:
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Switchyard local CA")])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write_key(pki.ca_key, key)
    _write_cert(pki.ca, cert)
    return cert, key


def _make_leaf(
    pki: LocalPKI, ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, now: dt.datetime
) -> None:
    key = _new_key()
    public = key.public_key()
    names: list[x509.GeneralName] = [x509.DNSName(n) for n in LOCAL_NAMES]
    names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in LOCAL_IPS]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=LEAF_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    _write_key(pki.key, key)
    _write_cert(pki.cert, cert)


def _load_ca(pki: LocalPKI) -> CA | None:
    try:
        cert = x509.load_pem_x509_certificate(pki.ca.read_bytes())
        key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    except (OSError, ValueError):
        return None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return None
    return cert, key


def _leaf_good_until(pki: LocalPKI, ca: x509.Certificate) -> dt.datetime | None:
    try:
        cert = x509.load_pem_x509_certificate(pki.cert.read_bytes())
    except (OSError, ValueError):
        return None
    if not pki.key.is_file() or cert.issuer != ca.subject:
        return None
    return cert.not_valid_after_utc


def ensure_local_pki(var_dir: Path, *, now: dt.datetime | None = None) -> tuple[LocalPKI, bool]:
    """``<var_dir>/tls/`` with a CA and a server certificate (see the module docstring);
    (the files, whether anything was made now)."""
    moment = now or dt.datetime.now(dt.UTC)
    pki = LocalPKI(var_dir / DIR_NAME)
    pki.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    made = False
    loaded = _load_ca(pki)
    if loaded is None or loaded[0].not_valid_after_utc <= moment:
        loaded = _make_ca(pki, moment)
        made = True
    ca, ca_key = loaded
    until = _leaf_good_until(pki, ca)
    if made or until is None or until - moment < dt.timedelta(days=RENEW_WITHIN_DAYS):
        _make_leaf(pki, ca, ca_key, moment)
        made = True
    return pki, made


def up_environ(
    pki: LocalPKI, env: Mapping[str, str], *, web_port: int, router_port: int
) -> dict[str, str]:
    """The variables ``up --tls`` adds to its processes' environment (ones already set in
    ``env`` for HSTS and CSRF win)."""
    cert, key, ca = str(pki.cert), str(pki.key), str(pki.ca)
    out = {
        tls.ENV_CERT: cert,
        tls.ENV_KEY: key,
        tls.ENV_WORKER_CERT: cert,
        tls.ENV_WORKER_KEY: key,
        tls.ENV_WORKER_CLIENT_CA: ca,
        tls.ENV_UPSTREAM_CA: ca,
        tls.ENV_UPSTREAM_CERT: cert,
        tls.ENV_UPSTREAM_KEY: key,
        "SWITCHYARD_HSTS_SECONDS": env.get("SWITCHYARD_HSTS_SECONDS") or UP_HSTS_SECONDS,
    }
    if not env.get("CSRF_TRUSTED_ORIGINS"):
        out["CSRF_TRUSTED_ORIGINS"] = f"https://127.0.0.1:{web_port},https://localhost:{web_port}"
    return out


def require_serving_cert(env: Mapping[str, str]) -> None:
    """Refuse to start the control plane with an unusable ``SWITCHYARD_TLS_CERT`` (expired,
    not yet valid, not matching its key): ImproperlyConfigured naming the variable and file.
    (uvicorn loads the files first and fails on a missing one with its own error.)"""
    try:
        serving = tls.server_tls(env)
        if serving is not None:
            serving.context()
    except tls.TLSConfigError as exc:
        from django.core.exceptions import ImproperlyConfigured  # noqa: PLC0415

        raise ImproperlyConfigured(f"control plane: {exc}") from None


def trust_lines(pki: LocalPKI, *, router: str) -> list[str]:
    """How to trust the local CA (the banner's lines)."""
    return [
        f"  TLS: a local CA signed this machine's certificate; trust {pki.ca}",
        f"    curl --cacert {pki.ca} {router}/healthz",
        f"    SSL_CERT_FILE={pki.ca} .venv/bin/python ...   (httpx/openai read it)",
        f'    OpenAI(base_url="{router}/v1", api_key=KEY,',
        f'           http_client=httpx.Client(verify="{pki.ca}"))',
        "    workers require a client certificate signed by it (mTLS); the router presents",
        f"    {pki.cert}",
    ]
