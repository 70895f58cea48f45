"""TLS settings from the environment, and the ``ssl`` contexts built from them.

Three roles, each off unless its variables are set (docs/operations/tls.md):

- ``SWITCHYARD_TLS_CERT``, ``SWITCHYARD_TLS_KEY``: the router and the control plane serve HTTPS.
- ``SWITCHYARD_WORKER_TLS_CERT``, ``_KEY`` and ``_CLIENT_CA``: model workers serve HTTPS; with
  ``_CLIENT_CA`` only to clients holding a certificate it signed (mTLS).
- ``SWITCHYARD_UPSTREAM_TLS_CA``, ``_CERT`` and ``_KEY``: whoever calls workers (the router, a
  worker's supervisor, the control plane's measurements) trusts workers signed by ``_CA`` and
  presents ``_CERT``.

A certificate is checked when its role starts (:func:`check_certificate`): a missing or
unreadable file, a key that does not match, or a certificate past its end (or before its start)
refuses the start with a :class:`TLSConfigError` naming the variable, the file and the dates,
so what an operator sees is one sentence, not an OpenSSL traceback. One within
:data:`EXPIRY_WARNING_DAYS` of its end is logged as a warning.

Plain Python (``ssl`` and ``cryptography``): no Django, nothing at import time.
"""

from __future__ import annotations

import datetime as dt
import logging
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509

log = logging.getLogger("switchyard.tls")

ENV_CERT: Final = "SWITCHYARD_TLS_CERT"
ENV_KEY: Final = "SWITCHYARD_TLS_KEY"
ENV_WORKER_CERT: Final = "SWITCHYARD_WORKER_TLS_CERT"
ENV_WORKER_KEY: Final = "SWITCHYARD_WORKER_TLS_KEY"
ENV_WORKER_CLIENT_CA: Final = "SWITCHYARD_WORKER_TLS_CLIENT_CA"
ENV_UPSTREAM_CA: Final = "SWITCHYARD_UPSTREAM_TLS_CA"
ENV_UPSTREAM_CERT: Final = "SWITCHYARD_UPSTREAM_TLS_CERT"
ENV_UPSTREAM_KEY: Final = "SWITCHYARD_UPSTREAM_TLS_KEY"
EXPIRY_WARNING_DAYS: Final = 14


class TLSConfigError(ValueError):
    """A TLS variable names a file that cannot be used (the message says which and why)."""


@dataclass(frozen=True, slots=True)
class ServerTLS:
    """A server's certificate and key; ``client_ca``: require client certificates it signed."""

    cert: Path
    key: Path
    client_ca: Path | None = None
    cert_var: str = ENV_CERT

    def context(self) -> ssl.SSLContext:
        """A server context (TLS 1.2+); verifies client certificates when ``client_ca``."""
        check_certificate(self.cert, self.key, variable=self.cert_var)
        ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.cert, self.key)
        if self.client_ca is not None:
            _load_ca(ctx, self.client_ca, variable=ENV_WORKER_CLIENT_CA)
            ctx.verify_mode = ssl.CERT_REQUIRED
        return ctx


@dataclass(frozen=True, slots=True)
class ClientTLS:
    """How to call workers over HTTPS: the CA that signs them (None: the system's) and our
    client certificate (None: present none)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.ca is not None:
            _load_ca(ctx, self.ca, variable=ENV_UPSTREAM_CA)
        if self.cert is not None:
            key = self.key or self.cert
            check_certificate(self.cert, key, variable=ENV_UPSTREAM_CERT)
            ctx.load_cert_chain(self.cert, key)
        return ctx


def _path(env: Mapping[str, str], name: str) -> Path | None:
    raw = env.get(name, "").strip()
    return Path(raw) if raw else None


def _pair(
    cert: Path | None, key: Path | None, cert_var: str, key_var: str
) -> tuple[Path, Path] | None:
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        missing = cert_var if cert is None else key_var
        given = key_var if cert is None else cert_var
        raise TLSConfigError(f"{given} is set but {missing} is not: TLS needs both")
    return cert, key


def server_tls(env: Mapping[str, str]) -> ServerTLS | None:
    """The router's and control plane's HTTPS certificate, or None (plain HTTP)."""
    pair = _pair(_path(env, ENV_CERT), _path(env, ENV_KEY), ENV_CERT, ENV_KEY)
    return None if pair is None else ServerTLS(*pair)


def worker_tls(env: Mapping[str, str]) -> ServerTLS | None:
    """A model worker's HTTPS certificate (and client CA for mTLS), or None (plain HTTP)."""
    pair = _pair(
        _path(env, ENV_WORKER_CERT), _path(env, ENV_WORKER_KEY), ENV_WORKER_CERT, ENV_WORKER_KEY
    )
    client_ca = _path(env, ENV_WORKER_CLIENT_CA)
    if pair is None:
        if client_ca is not None:
            raise TLSConfigError(
                f"{ENV_WORKER_CLIENT_CA} is set but {ENV_WORKER_CERT}/{ENV_WORKER_KEY} are not: "
                "a worker requires client certificates only when it serves HTTPS"
            )
        return None
    return ServerTLS(*pair, client_ca=client_ca, cert_var=ENV_WORKER_CERT)


def upstream_tls(env: Mapping[str, str]) -> ClientTLS | None:
    """How the router (and the worker's own checks) call workers: None when nothing is set
    (https:// workers are then verified against the system's CAs, with no client cert)."""
    ca = _path(env, ENV_UPSTREAM_CA)
    pair = _pair(
        _path(env, ENV_UPSTREAM_CERT),
        _path(env, ENV_UPSTREAM_KEY),
        ENV_UPSTREAM_CERT,
        ENV_UPSTREAM_KEY,
    )
    if ca is None and pair is None:
        return None
    cert, key = pair if pair is not None else (None, None)
    return ClientTLS(ca=ca, cert=cert, key=key)


def upstream_context(env: Mapping[str, str]) -> ssl.SSLContext | None:
    """The client context for calls to workers, or None (aiohttp's default for https)."""
    tls = upstream_tls(env)
    return None if tls is None else tls.context()


def _load_ca(ctx: ssl.SSLContext, path: Path, *, variable: str) -> None:
    try:
        ctx.load_verify_locations(cafile=path)
    except (OSError, ssl.SSLError) as exc:
        raise TLSConfigError(f"{variable}={path}: cannot load the CA certificate: {exc}") from exc


def check_certificate(
    cert: Path, key: Path, *, variable: str, now: dt.datetime | None = None
) -> x509.Certificate:
    """The certificate at ``cert`` if it can serve now with ``key``; else TLSConfigError.
    Logs a warning when it ends within :data:`EXPIRY_WARNING_DAYS`."""
    try:
        pem = cert.read_bytes()
    except OSError as exc:
        raise TLSConfigError(f"{variable}={cert}: cannot read it: {exc.strerror}") from exc
    try:
        certificate = x509.load_pem_x509_certificate(pem)
    except ValueError as exc:
        raise TLSConfigError(f"{variable}={cert}: not a PEM certificate ({exc})") from exc
    moment = now or dt.datetime.now(dt.UTC)
    start, end = certificate.not_valid_before_utc, certificate.not_valid_after_utc
    subject = certificate.subject.rfc4514_string()
    if moment > end:
        raise TLSConfigError(
            f"{variable}={cert}: the certificate ({subject}) expired on {end:%Y-%m-%d %H:%M} "
            "UTC; renew it (for `switchyard up --tls`: delete the var directory's tls/ folder "
            "and start again)"
        )
    if moment < start:
        raise TLSConfigError(
            f"{variable}={cert}: the certificate ({subject}) is not valid before "
            f"{start:%Y-%m-%d %H:%M} UTC (check this machine's clock)"
        )
    if end - moment < dt.timedelta(days=EXPIRY_WARNING_DAYS):
        log.warning("%s=%s: the certificate (%s) expires on %s", variable, cert, subject, end)
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        probe.load_cert_chain(cert, key)
    except ssl.SSLError as exc:  # before OSError, its base class
        raise TLSConfigError(
            f"{variable}={cert}: the key {key} does not belong to this certificate or cannot "
            f"be read ({exc.reason or exc})"
        ) from exc
    except OSError as exc:
        raise TLSConfigError(f"{variable}: cannot read the key {key}: {exc.strerror}") from exc
    return certificate
