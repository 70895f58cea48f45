"""``manage.py serve_encoder``: the demo encoder registered as a torch ModelVersion (its digest
verified before load), refusals as CommandErrors, and the real worker as a process: registered,
heartbeated, ready, drained and gone on SIGTERM.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import redis
from django.core.management import CommandError, call_command
from django.db import connection
from fixtures.net import free_port
from fixtures.wait import eventually

from apps.common.models import AuditEvent
from apps.models.demo_encoder import demo_encoder_register, encoder_artifact_dir
from apps.models.models import Endpoint
from apps.models.services import pool_create
from runtime.workers.heartbeat import endpoint_heartbeat_key

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture
def pool(db):
    return pool_create(
        actor=None, name="encoder-cpu", hardware_tier="cpu", cost_per_replica_hour="0.05"
    )


@pytest.mark.db
@pytest.mark.django_db
def test_demo_registration_is_idempotent_and_records_the_digest():
    first = demo_encoder_register(actor=None)
    second = demo_encoder_register(actor=None)
    assert first.created
    assert not second.created
    assert first.version.pk == second.version.pk
    version = first.version
    assert (version.runtime, version.model.task, version.is_published) == (
        "torch", "embedding", True,
    )  # fmt: skip
    assert "model.safetensors" in version.manifest["files"]
    assert version.manifest["max_context"] == 256


@pytest.mark.db
@pytest.mark.django_db
def test_a_tampered_copy_is_refused_before_loading(tmp_path, pool):
    copy = tmp_path / "minilm"
    shutil.copytree(encoder_artifact_dir(), copy)
    demo_encoder_register(actor=None, folder=copy, model_name="minilm-copy")
    with (copy / "config.json").open("a") as fh:
        fh.write("\n")
    with pytest.raises(CommandError, match=r"does not match the registry.*config\.json"):
        call_command(
            "serve_encoder", "--model", "minilm-copy", "--pool", "encoder-cpu",
            "--port", str(free_port()),
        )  # fmt: skip
    assert not Endpoint.objects.exists()


@pytest.mark.db
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "nope", "--pool", "encoder-cpu"], "no model named 'nope'"),
        (["--model", "minilm", "--pool", "nope"], "no pool named 'nope'"),
        (["--model", "minilm", "--pool", "encoder-cpu", "--max-batch", "0"], "max_batch"),
        (["--model", "minilm", "--pool", "encoder-cpu", "--label", "v9"], "no version labelled"),
    ],
)
def test_bad_arguments_are_command_errors(args, message, pool):
    demo_encoder_register(actor=None)
    with pytest.raises(CommandError, match=message):
        call_command("serve_encoder", *args, "--port", str(free_port()))


def subprocess_database_url() -> str:
    conf = connection.settings_dict
    password = f":{conf['PASSWORD']}" if conf.get("PASSWORD") else ""
    return f"postgres://{conf['USER']}{password}@{conf['HOST']}:{conf['PORT']}/{conf['NAME']}"


@pytest.mark.db
@pytest.mark.integration
@pytest.mark.django_db(transaction=True)  # the serve_encoder process must see the rows
def test_registers_heartbeats_and_drains_on_sigterm(pool, tmp_path):
    demo_encoder_register(actor=None)
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    log = tmp_path / "serve_encoder.out"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "serve_encoder", "--model", "minilm",
             "--pool", "encoder-cpu", "--port", str(port), "--max-batch", "4",
             "--grace", "10", "--heartbeat-ttl", "6"],
            cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))

    def state() -> str | None:
        assert proc.poll() is None, log.read_text()[-3000:]
        endpoint = Endpoint.objects.filter(base_url=base_url).first()
        return None if endpoint is None else endpoint.state

    try:
        eventually(lambda: state() == "ready", timeout=120, what="the endpoint turned ready")
        endpoint = Endpoint.objects.get(base_url=base_url)
        key = endpoint_heartbeat_key(endpoint.pk)
        assert json.loads(client.get(key))["state"] == "ready"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
        heartbeat_left = client.exists(key)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        client.close()
    assert heartbeat_left == 0
    endpoint.refresh_from_db()
    assert endpoint.state == "gone"
    text = log.read_text()
    assert "verified" in text
    assert f"stopped; endpoint {endpoint.pk} is gone" in text
    transitions = [
        (event.action, event.after.get("state"))
        for event in AuditEvent.objects.filter(action__startswith="endpoint.").order_by("pk")
    ]
    assert transitions == [
        ("endpoint.register", "starting"),
        ("endpoint.set_state", "ready"),
        ("endpoint.set_state", "draining"),
        ("endpoint.set_state", "gone"),
    ]
