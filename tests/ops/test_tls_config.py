"""TLS settings without a server: the local CA ``up --tls`` makes and keeps, the checks that
refuse a bad certificate with one clear sentence, the variables each role needs, the worker's
engine flags and the Procfile's web line."""

from __future__ import annotations

import datetime as dt
import os
import ssl
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography import x509

from config import paths
from config import tls as config_tls
from config.supervise import procfile_entries
from runtime import tls
from runtime.workers.launch import WorkerSpec, build_command

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
LONG_AGO = dt.datetime.now(dt.UTC) - dt.timedelta(days=3 * 365)


def test_up_makes_the_local_ca_once_and_keeps_it(tmp_path: Path) -> None:
    pki, made = config_tls.ensure_local_pki(tmp_path)
    assert made
    first = {p: p.read_bytes() for p in (pki.ca, pki.ca_key, pki.cert, pki.key)}
    for private in (pki.ca_key, pki.key):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    again, made_again = config_tls.ensure_local_pki(tmp_path)
    assert (again, made_again) == (pki, False)
    assert {p: p.read_bytes() for p in first} == first

    leaf = x509.load_pem_x509_certificate(pki.cert.read_bytes())
    names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert names.get_values_for_type(x509.DNSName) == ["localhost"]
    assert {str(ip) for ip in names.get_values_for_type(x509.IPAddress)} == {"127.0.0.1", "::1"}
    # OpenSSL verifies it for 127.0.0.1 and localhost against the CA (strict X.509 too), and
    # the server verifies the same certificate as the router's client certificate.
    client = tls.ClientTLS(ca=pki.ca, cert=pki.cert, key=pki.key).context()
    client.verify_flags |= ssl.VERIFY_X509_STRICT
    server = tls.ServerTLS(pki.cert, pki.key, client_ca=pki.ca).context()
    for host in ("127.0.0.1", "localhost"):
        _handshake(server, client, host)
    with pytest.raises(ssl.SSLError, match=r"CERTIFICATE_REQUIRED|PEER_DID_NOT_RETURN"):
        _handshake(server, tls.ClientTLS(ca=pki.ca).context(), "localhost")  # no client cert
    with pytest.raises(ssl.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
        _handshake(server, ssl.create_default_context(), "localhost")  # CA not trusted
    assert tls.check_certificate(pki.cert, pki.key, variable="T") == leaf


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, host: str) -> None:
    """A TLS handshake in memory; raises ssl.SSLError when either side refuses."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname=host)
    s = server.wrap_bio(s_in, s_out, server_side=True)
    done = {"c": False, "s": False}
    for _ in range(10):
        for name, side in (("c", c), ("s", s)):
            if not done[name]:
                try:
                    side.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            c.write(b"x")  # TLS 1.3: the server checks the client's certificate here
            s_in.write(c_out.read())
            assert s.read() == b"x"
            return
    raise AssertionError("the handshake did not finish")


def test_a_leaf_near_its_end_is_remade_from_the_kept_ca(tmp_path: Path) -> None:
    pki, _ = config_tls.ensure_local_pki(tmp_path, now=LONG_AGO)  # leaf: 825 days: expired
    ca = pki.ca.read_bytes()
    with pytest.raises(tls.TLSConfigError, match=r"expired on .* UTC; renew it"):
        tls.check_certificate(pki.cert, pki.key, variable="SWITCHYARD_TLS_CERT")
    _, made = config_tls.ensure_local_pki(tmp_path)
    assert made
    assert pki.ca.read_bytes() == ca
    tls.check_certificate(pki.cert, pki.key, variable="SWITCHYARD_TLS_CERT")


def test_bad_certificates_are_one_clear_sentence(tmp_path: Path) -> None:
    pki, _ = config_tls.ensure_local_pki(tmp_path / "a")
    other, _ = config_tls.ensure_local_pki(tmp_path / "b")
    with pytest.raises(tls.TLSConfigError, match="does not belong to this certificate"):
        tls.ServerTLS(pki.cert, other.key).context()
    with pytest.raises(tls.TLSConfigError, match=r"SWITCHYARD_TLS_CERT=.*cannot read it"):
        tls.ServerTLS(tmp_path / "missing.pem", pki.key).context()
    with pytest.raises(tls.TLSConfigError, match="not a PEM certificate"):
        tls.check_certificate(pki.key, pki.key, variable="X")
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(days=3650)
    with pytest.raises(tls.TLSConfigError, match="expired"):
        tls.check_certificate(pki.cert, pki.key, variable="X", now=soon)


def test_each_role_reads_its_variables_and_refuses_half_of_them(tmp_path: Path) -> None:
    pki, _ = config_tls.ensure_local_pki(tmp_path)
    env = config_tls.up_environ(pki, {}, web_port=8000, router_port=8080)
    assert tls.server_tls({}) is None
    assert tls.worker_tls({}) is None
    assert tls.upstream_tls({}) is None
    assert tls.upstream_context({}) is None
    assert tls.server_tls(env) == tls.ServerTLS(pki.cert, pki.key)
    worker = tls.worker_tls(env)
    assert worker is not None
    assert worker.client_ca == pki.ca
    assert worker.context().verify_mode == ssl.CERT_REQUIRED
    assert tls.upstream_tls(env) == tls.ClientTLS(ca=pki.ca, cert=pki.cert, key=pki.key)
    assert env["SWITCHYARD_HSTS_SECONDS"] == "3600"
    assert env["CSRF_TRUSTED_ORIGINS"] == "https://127.0.0.1:8000,https://localhost:8000"
    kept = config_tls.up_environ(
        pki, {"SWITCHYARD_HSTS_SECONDS": "60", "CSRF_TRUSTED_ORIGINS": "https://x"},
        web_port=1, router_port=2,
    )  # fmt: skip
    assert kept["SWITCHYARD_HSTS_SECONDS"] == "60"
    assert "CSRF_TRUSTED_ORIGINS" not in kept
    with pytest.raises(tls.TLSConfigError, match="SWITCHYARD_TLS_CERT is set but"):
        tls.server_tls({tls.ENV_CERT: str(pki.cert)})
    with pytest.raises(tls.TLSConfigError, match="SWITCHYARD_UPSTREAM_TLS_KEY is set but"):
        tls.upstream_tls({tls.ENV_UPSTREAM_KEY: str(pki.key)})
    with pytest.raises(tls.TLSConfigError, match="requires client certificates only when"):
        tls.worker_tls({tls.ENV_WORKER_CLIENT_CA: str(pki.ca)})


def test_a_tls_worker_runs_vllm_with_client_certificates_required(tmp_path: Path) -> None:
    pki, _ = config_tls.ensure_local_pki(tmp_path)
    spec = WorkerSpec(
        artifact_dir=tmp_path, expected_digest="d", served_model_name="m", port=9000,
        tls=tls.ServerTLS(pki.cert, pki.key, client_ca=pki.ca),
    )  # fmt: skip
    assert spec.base_url == "https://127.0.0.1:9000"
    argv = build_command(spec)
    flags = argv[argv.index("--ssl-certfile") :][:8]
    assert flags == [
        "--ssl-certfile", str(pki.cert), "--ssl-keyfile", str(pki.key),
        "--ssl-ca-certs", str(pki.ca), "--ssl-cert-reqs", "2",
    ]  # fmt: skip
    plain = WorkerSpec(artifact_dir=tmp_path, expected_digest="d", served_model_name="m", port=1)
    assert plain.base_url.startswith("http://")
    assert "--ssl-certfile" not in build_command(plain)


def test_the_procfile_web_line_serves_https_only_when_given_a_certificate() -> None:
    line = procfile_entries(paths.procfile().read_text())["web"]
    argv = ["/bin/sh", "-c", f"printf '%s\\n' {line}"]
    base = {"PATH": os.environ["PATH"], "SWITCHYARD_WEB_PORT": "8000"}
    plain = subprocess.run(argv, env=base, capture_output=True, text=True, check=True)
    assert "--ssl-certfile" not in plain.stdout
    env = {**base, "SWITCHYARD_TLS_CERT": "/a b/c.pem", "SWITCHYARD_TLS_KEY": "/a b/k.pem"}
    served = subprocess.run(argv, env=env, capture_output=True, text=True, check=True)
    assert served.stdout.splitlines()[-4:] == [
        "--ssl-certfile", "/a b/c.pem", "--ssl-keyfile", "/a b/k.pem",
    ]  # fmt: skip


def test_the_control_plane_refuses_an_expired_certificate_naming_it(tmp_path: Path) -> None:
    pki, _ = config_tls.ensure_local_pki(tmp_path, now=LONG_AGO)
    env = {
        **{k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"},
        "SECRET_KEY": "k" * 40, "SWITCHYARD_VAR_DIR": str(tmp_path), "PYTHONPATH": str(REPO),
        tls.ENV_CERT: str(pki.cert), tls.ENV_KEY: str(pki.key),
    }  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", "import config.asgi"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=90, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert f"control plane: SWITCHYARD_TLS_CERT={pki.cert}: the certificate" in done.stderr
    assert "expired on" in done.stderr
