"""``manage.py serve_model``: refusals (CommandError) and the real thing as a process.

The engine is the vLLM simulator (``--backend simulator``): the supervisor's registration,
heartbeat and drain logic are the same for vLLM, and the simulator starts in a second.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import redis
from django.core.management import CommandError, call_command
from django.db import connection
from fixtures.net import free_port, port_accepts
from fixtures.wait import eventually

from apps.common.models import AuditEvent
from apps.models.models import Endpoint, ModelVersion
from apps.models.selectors import model_get_by_name
from apps.models.services import (
    endpoint_register,
    endpoint_set_state,
    model_create,
    model_version_create,
    model_version_publish,
    pool_create,
)
from apps.models.services.signing import (
    model_version_sign_with,
    trusted_key_create,
    trusted_key_set_active,
)
from runtime.artifacts import compute_manifest, manifest_digest
from runtime.procs import descendant_pids, pid_alive
from runtime.signing import generate_private_key, public_key_text, sign_digest
from runtime.workers.heartbeat import endpoint_heartbeat_key

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[3]
MODEL = "sim-llama"


@pytest.fixture
def artifact(tmp_path):
    folder = tmp_path / "sim-llama"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "weights.bin").write_bytes(b"weights")
    return folder


@pytest.fixture
def pool(db):
    return pool_create(actor=None, name="cpu", hardware_tier="cpu", cost_per_replica_hour="0.1")


@pytest.fixture
def make_version(db, artifact):
    """Register (and publish) a version of the artifact; ``files`` overrides what the registry
    records as its files (the digest follows them, as the registry requires)."""

    def make(label="v1", *, publish=True, runtime="simulator", uri=None, files=None):
        model = model_get_by_name(MODEL) or model_create(actor=None, name=MODEL, task="chat")
        if files is None:
            _, files = compute_manifest(artifact)
        version = model_version_create(
            actor=None,
            model=model,
            label=label,
            artifact_uri=uri or artifact.as_uri(),
            digest=manifest_digest(files),
            manifest={
                "tokenizer": "x",
                "max_context": 2048,
                "default_sampling": {},
                "files": files,
            },
            runtime=runtime,
        )
        return model_version_publish(actor=None, version=version) if publish else version

    return make


def serve(*args: str, port: int | None = None) -> None:
    call_command(
        "serve_model", "--model", MODEL, "--pool", "cpu", "--port", str(port or free_port()),
        "--backend", "simulator", *args,
    )  # fmt: skip


# --- refusals -------------------------------------------------------------------------------


@pytest.mark.db
@pytest.mark.django_db
@pytest.mark.parametrize("damage", ["tampered file", "wrong digest in the registry"])
def test_digest_mismatch_refuses_to_start(damage, make_version, pool, artifact):
    if damage == "tampered file":
        make_version()
        (artifact / "weights.bin").write_bytes(b"weightz")
    else:
        _, files = compute_manifest(artifact)
        registered = make_version(files={**files, "weights.bin": "ab" * 32})
    with pytest.raises(CommandError) as excinfo:
        serve()
    message = str(excinfo.value)
    assert message.startswith(
        f"refusing to serve {MODEL}: the artifact in {artifact} does not match the registry: "
    )
    assert message.endswith("differing files: weights.bin")
    if damage != "tampered file":
        assert f"does not match expected {registered.digest}" in message
    assert not Endpoint.objects.exists()


@pytest.mark.db
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("setup", "args", "message"),
    [
        ("none", [], f"no model named '{MODEL}'"),
        ("draft", [], f"model '{MODEL}' has no published version"),
        ("v1", ["--label", "v9"], f"model '{MODEL}' has no version labelled 'v9'"),
        ("draft", ["--label", "v1"], f"{MODEL}:v1 is not published; publish it before serving"),
        ("v1", ["--pool", "gpu"], "no pool named 'gpu'"),
        ("s3", [], "a replica serves local folders only (file:///path)"),
        ("torch", [], f"{MODEL}:v1 runs on the torch runtime"),
        ("v1", ["--capacity", "0"], "--capacity must be a positive integer"),
        ("v1", ["--grace", "-1"], "--grace must be >= 0"),
        ("v1", ["--kv-events-port", "-1"], "--kv-events-port must be >= 0"),
    ],
)
def test_bad_arguments_are_command_errors(setup, args, message, make_version, pool):
    if setup == "draft":
        make_version(publish=False)
    elif setup == "v1":
        make_version()
    elif setup == "s3":
        make_version(uri="s3://bucket/sim-llama")
    elif setup == "torch":
        make_version(runtime="torch")
    with pytest.raises(CommandError) as excinfo:
        serve(*args)
    assert message in str(excinfo.value)
    assert not Endpoint.objects.exists()


@pytest.mark.db
@pytest.mark.django_db
def test_port_in_use_is_a_command_error(make_version, pool):
    make_version()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError, match=f"cannot serve on 127.0.0.1:{port}"):
            serve(port=port)
    assert not Endpoint.objects.exists()


@pytest.mark.db
@pytest.mark.integration
@pytest.mark.django_db(transaction=True)  # the hooks write from asgiref's worker thread
def test_engine_failing_to_start_leaves_the_endpoint_gone(make_version, pool, tmp_path):
    make_version()
    with pytest.raises(CommandError, match=r"did not start: the engine exited with code 2"):
        serve("--engine-args", "--max-num-seqs 0", "--engine-log", str(tmp_path / "engine.log"))
    assert list(Endpoint.objects.values_list("state", flat=True)) == ["gone"]


@pytest.fixture
def heartbeats():
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    yield client
    client.close()


@pytest.mark.db
@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_endpoint_left_by_a_dead_worker_is_retired(make_version, pool, tmp_path, heartbeats):
    version = make_version()
    port = free_port()
    stale = endpoint_register(
        actor=None, pool=pool, version=version, base_url=f"http://127.0.0.1:{port}", capacity=8
    )
    endpoint_set_state(actor=None, endpoint=stale, state="ready")
    heartbeats.delete(endpoint_heartbeat_key(stale.pk))  # its worker died: the key expired
    with pytest.raises(CommandError, match="did not start"):  # the engine fails; that is fine
        serve(
            "--engine-args", "--max-num-seqs 0", "--engine-log", str(tmp_path / "engine.log"),
            port=port,
        )  # fmt: skip
    stale.refresh_from_db()
    assert stale.state == "gone"
    assert Endpoint.objects.count() == 2  # a new endpoint was registered (and is gone too)


@pytest.mark.db
@pytest.mark.integration
@pytest.mark.django_db(transaction=True)
def test_endpoint_with_a_live_heartbeat_is_not_taken_over(make_version, pool, heartbeats):
    version = make_version()
    port = free_port()
    live = endpoint_register(
        actor=None, pool=pool, version=version, base_url=f"http://127.0.0.1:{port}", capacity=8
    )
    key = endpoint_heartbeat_key(live.pk)
    heartbeats.set(key, "{}", px=30_000)
    try:
        with pytest.raises(
            CommandError, match="the registry refused the endpoint: base_url: A live"
        ):
            serve(port=port)
    finally:
        heartbeats.delete(key)
    live.refresh_from_db()
    assert live.state == "starting"
    assert Endpoint.objects.count() == 1


# --- the real process -----------------------------------------------------------------------


def subprocess_database_url() -> str:
    conf = connection.settings_dict
    password = f":{conf['PASSWORD']}" if conf.get("PASSWORD") else ""
    return f"postgres://{conf['USER']}{password}@{conf['HOST']}:{conf['PORT']}/{conf['NAME']}"


def serve_model_process(
    port: int, tmp_path, out, *args: str, signatures: str | None = None
) -> subprocess.Popen:  # type: ignore[no-untyped-def]
    """``manage.py serve_model`` (simulator backend) as a real process, output to ``out``;
    ``signatures`` sets SWITCHYARD_ARTIFACT_SIGNATURES (the test session's otherwise)."""
    env = {**os.environ, "DATABASE_URL": subprocess_database_url()}
    if signatures is not None:
        env["SWITCHYARD_ARTIFACT_SIGNATURES"] = signatures
    return subprocess.Popen(
        [sys.executable, "manage.py", "serve_model", "--model", MODEL, "--pool", "cpu",
         "--port", str(port), "--backend", "simulator",
         "--engine-log", str(tmp_path / "engine.log"), *args],
        cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
    )  # fmt: skip


def stream_in_thread(url: str, port: int, result: dict) -> threading.Thread:
    """POST a streaming completion from a thread; record its data lines in ``result``."""

    def run() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        body = {"model": MODEL, "prompt": "x", "max_tokens": 100, "stream": True}
        headers = {"Content-Type": "application/json"}
        conn.request("POST", "/v1/completions", json.dumps(body), headers)
        resp = conn.getresponse()
        result["status"] = resp.status
        lines = result.setdefault("lines", [])
        for raw in resp:
            line = raw.decode().strip()
            if line.startswith("data: "):
                lines.append(line[6:])
                result["first"].set()
        conn.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def wait_state(base_url: str, state: str, proc: subprocess.Popen, timeout: float = 60) -> Endpoint:

    def reached() -> Endpoint | None:
        assert proc.poll() is None, "serve_model exited early"
        endpoint = Endpoint.objects.filter(base_url=base_url).first()
        return endpoint if endpoint is not None and endpoint.state == state else None

    return eventually(reached, timeout=timeout, interval=0.1, what=f"{base_url} in state {state}")


@pytest.mark.db
@pytest.mark.integration
@pytest.mark.django_db(transaction=True)  # the serve_model process must see the rows
def test_sigterm_drains_in_flight_request_then_marks_gone(make_version, pool, tmp_path):
    make_version()
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    out = (tmp_path / "serve_model.out").open("w")
    proc = serve_model_process(
        port, tmp_path, out, "--grace", "20", "--heartbeat-ttl", "6",
        "--engine-args", "--decode-a-ms 20 --decode-b-ms 0",
    )  # fmt: skip
    client = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    try:
        endpoint = wait_state(base_url, "ready", proc)
        key = endpoint_heartbeat_key(endpoint.pk)
        assert json.loads(client.get(key))["state"] == "ready"
        assert 0 < client.pttl(key) <= 6000
        # The engine publishes KV events where the endpoint says (a free port by default).
        events_host, events_port = endpoint.kv_events_url.removeprefix("tcp://").split(":")
        assert events_host == "127.0.0.1"
        assert port_accepts(int(events_port))

        result: dict = {"first": threading.Event()}
        stream = stream_in_thread(base_url, port, result)
        assert result["first"].wait(10)
        proc.send_signal(signal.SIGTERM)
        wait_state(base_url, "draining", proc, timeout=10)
        assert stream.is_alive()  # 100 tokens at 50/s: still streaming while draining
        assert json.loads(client.get(key))["state"] == "draining"

        stream.join(30)
        assert proc.wait(30) == 0
        heartbeat_left = client.exists(key)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
        client.close()
    assert heartbeat_left == 0
    log = (tmp_path / "serve_model.out").read_text()
    assert result["status"] == 200
    assert result["lines"][-1] == "[DONE]", log
    assert json.loads(result["lines"][-2])["choices"][0]["finish_reason"] == "length"
    endpoint.refresh_from_db()
    assert endpoint.state == "gone"
    assert f"stopped; endpoint {endpoint.pk} is gone" in log
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


@pytest.mark.db
@pytest.mark.integration
@pytest.mark.django_db(transaction=True)  # the serve_model process must see the rows
def test_a_killed_engine_takes_the_endpoint_out_of_routing_and_comes_back(
    make_version, pool, tmp_path
):
    make_version()
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    out = (tmp_path / "serve_model.out").open("w")
    proc = serve_model_process(port, tmp_path, out, "--grace", "1")
    seen: set[int] = set()
    try:
        endpoint = wait_state(base_url, "ready", proc)
        engines = descendant_pids(proc.pid)
        seen.update(engines)
        killed_at = time.monotonic()
        for pid in engines:
            os.kill(pid, signal.SIGKILL)
        wait_state(base_url, "draining", proc, timeout=10)
        out_of_routing_s = time.monotonic() - killed_at
        again = wait_state(base_url, "ready", proc, timeout=60)
        back_s = time.monotonic() - killed_at
        assert again.pk == endpoint.pk  # the same endpoint, back after a fresh warm-up
        seen.update(descendant_pids(proc.pid))
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        out.close()
    print(f"\nout of routing {out_of_routing_s:.2f} s after kill -9, ready again {back_s:.2f} s")
    assert out_of_routing_s < 2.0, out_of_routing_s
    assert not [pid for pid in seen if pid_alive(pid)]  # no orphans
    endpoint.refresh_from_db()
    assert endpoint.state == "gone"
    assert "endpoint taken out of routing" in (tmp_path / "serve_model.out").read_text()


# --- artifact signatures ----------------------------------------------------------------------


@pytest.fixture
def signed(make_version):
    """Make a version signed by the trusted key "release"; returns (version, key)."""

    def make(**kwargs):
        key, _ = generate_private_key()
        trusted = trusted_key_create(actor=None, name="release", public_key=public_key_text(key))
        version = model_version_sign_with(
            actor=None, version=make_version(**kwargs), private_key=key
        )
        return version, trusted, key

    return make


def refusal_event(version):
    event = AuditEvent.objects.filter(action="model_version.artifact_refused").get()
    assert (event.target_type, event.target_id) == ("registry.modelversion", str(version.pk))
    return event


@pytest.mark.db
@pytest.mark.django_db
@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("unsigned", "the version is not signed and artifact signatures are required"),
        ("key deactivated", "signed with key 'release', which the registry does not trust"),
        ("signature tampered", "the signature does not verify against digest"),
    ],
)
def test_unsigned_or_badly_signed_is_refused_with_an_event(
    case, reason, signed, make_version, pool, settings, caplog
):
    settings.ARTIFACT_SIGNATURES = "required"
    if case == "unsigned":
        version = make_version()
    else:
        version, trusted, key = signed()
    if case == "key deactivated":
        trusted_key_set_active(actor=None, key=trusted, active=False)
    if case == "signature tampered":  # the registry row changed behind the services' back
        other = sign_digest(key, "ab" * 32)
        ModelVersion.objects.filter(pk=version.pk).update(signature=other)
    with caplog.at_level("ERROR", logger="switchyard.worker"), pytest.raises(CommandError) as exc:
        serve()
    message = str(exc.value)
    assert message.startswith(f"refusing to serve {MODEL}: ")
    assert reason in message
    assert not Endpoint.objects.exists()
    assert refusal_event(version).after["reason"] == message
    assert message in caplog.text


@pytest.mark.db
@pytest.mark.django_db
def test_optional_signatures_let_an_unsigned_version_through_and_a_bad_mode_is_an_error(
    make_version, pool, settings
):
    """ "optional" lets an unsigned version reach the engine (here: a port already taken, so
    the refusal is the port's, after the signature check) and still checks a signature."""
    settings.ARTIFACT_SIGNATURES = "optional"
    make_version()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(CommandError, match=r"cannot serve on 127\.0\.0\.1"):
            serve(port=taken.getsockname()[1])
    settings.ARTIFACT_SIGNATURES = "sometimes"
    with pytest.raises(CommandError, match="SWITCHYARD_ARTIFACT_SIGNATURES is 'sometimes'"):
        serve()


@pytest.mark.db
@pytest.mark.integration
@pytest.mark.django_db(transaction=True)  # the serve_model process must see the rows
def test_a_worker_process_serves_a_signed_version_and_refuses_a_bad_signature(
    signed, pool, tmp_path
):
    version, _trusted, key = signed()
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    with (tmp_path / "good.out").open("w") as out:
        proc = serve_model_process(port, tmp_path, out, "--grace", "1", signatures="required")
        try:
            wait_state(base_url, "ready", proc)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "signature of sim-llama by key 'release' verified" in (tmp_path / "good.out").read_text()

    ModelVersion.objects.filter(pk=version.pk).update(signature=sign_digest(key, "cd" * 32))
    with (tmp_path / "bad.out").open("w") as out:
        proc = serve_model_process(free_port(), tmp_path, out, signatures="required")
        assert proc.wait(60) != 0
    log = (tmp_path / "bad.out").read_text()
    reason = refusal_event(version).after["reason"]
    assert reason.startswith(f"refusing to serve {MODEL}: the signature does not verify")
    assert f"ERROR switchyard.worker {reason}" in log  # the log line
    assert Endpoint.objects.filter(state="gone").count() == 1  # only the good run's
