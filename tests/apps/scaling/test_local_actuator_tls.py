"""The local actuator under ``up --tls``: the replica it starts (``manage.py serve_model``, the
simulator backend) serves HTTPS, requires client certificates, registers its ``https://``
endpoint, and the actuator finds it there and reads its load with the client certificate."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.conf import settings
from test_launchers import pool, prefix, subprocess_database_url

from apps.models.models import Endpoint, Pool
from apps.scaling.actuators.local import LocalActuator, engine_load
from apps.scaling.services import scaling_namespace
from config.tls import ensure_local_pki, up_environ
from runtime import tls

__all__ = ["pool", "prefix"]  # the fixtures, shared with test_launchers

pytestmark = pytest.mark.integration


def test_a_tls_replica_registers_https_and_its_load_is_read_over_mtls(
    pool: Pool, prefix: str, tmp_path: Path
) -> None:
    pki, _ = ensure_local_pki(tmp_path)
    env = {
        **os.environ, "DATABASE_URL": subprocess_database_url(),
        **up_environ(pki, {}, web_port=1, router_port=2),
    }  # fmt: skip
    actuator = LocalActuator(
        redis_url=settings.REDIS_URL, namespace=scaling_namespace(), log_dir=tmp_path / "log",
        launchers={"simulator": "serve_model"}, start_timeout_s=90, grace_s=1, env=env,
    )  # fmt: skip
    try:
        endpoint, _ = actuator.start(pool, routed=True)
        assert endpoint.state == Endpoint.State.READY
        assert endpoint.base_url.startswith("https://127.0.0.1:")
        client = tls.ClientTLS(ca=pki.ca, cert=pki.cert, key=pki.key).context()
        assert engine_load(endpoint.base_url, context=client) == 0
        no_cert = tls.ClientTLS(ca=pki.ca).context()
        assert engine_load(endpoint.base_url, context=no_cert) == float("inf")  # refused
        actuator.drain(pool, endpoint)
        endpoint.refresh_from_db()
        assert endpoint.state == Endpoint.State.GONE
    finally:
        actuator.stop_all(pool)
        actuator.close()
