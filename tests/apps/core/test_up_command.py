"""`manage.py up` / `switchyard up`: clear errors before anything starts, and (e2e) the whole
platform on embedded servers: the admin answers with its CSS, the router streams the demo model
from the vLLM replica the autoscaler started to the openai client with the API key the banner
printed, the demo's secrets are printed on the first run only, no process's log shows a prompt
(a planted secret), Ctrl-C / SIGINT leaves no process behind (vLLM's engine processes
included), and `up --tls` serves both over HTTPS with HSTS and Secure cookies."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis
from django.core.management import CommandError, call_command
from fixtures.net import free_port
from fixtures.platform_up import KEY_RE, READY_TIMEOUT_S, PlatformUp
from fixtures.router import (
    Publisher,
    World,
    redis_url,
    start_router,
    start_simulator,
    wait_ready,
)
from fixtures.wait import eventually

from apps.core.management.commands.up import Command as UpCommand
from apps.core.up_console import Addresses, banner, checks, serving_endpoint, without_password

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def var() -> Iterator[Path]:
    """A private var directory outside pytest's basetemp (PostgreSQL runs as another user)."""
    path = Path(tempfile.mkdtemp(prefix="switchyard-up-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.unit
def test_a_taken_control_plane_port_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError) as caught:
            call_command("up", port=port)
    assert f"Port {port} on 127.0.0.1 is already in use" in str(caught.value)
    assert "the control plane" in str(caught.value)
    assert "--port" in str(caught.value)


@pytest.mark.unit
def test_a_taken_router_port_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError) as caught:
            call_command("up", port=free_port(), router_port=port)
    assert f"Port {port} on 127.0.0.1 is already in use" in str(caught.value)
    assert "the router" in str(caught.value)
    assert "pass --router-port N" in str(caught.value)


@pytest.mark.unit
def test_two_processes_on_one_port_is_a_clear_error() -> None:
    port = free_port()
    with pytest.raises(CommandError, match=f"--router-port and --port are both {port}"):
        call_command("up", port=port, router_port=port)
    with pytest.raises(CommandError, match="--router-port 70000 is not a TCP port number"):
        call_command("up", port=free_port(), router_port=70000)


@pytest.mark.unit
def test_ports_come_from_the_environment_when_not_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SWITCHYARD_ROUTER_PORT", "router")
    with pytest.raises(CommandError, match="SWITCHYARD_ROUTER_PORT='router' is not a TCP port"):
        call_command("up", port=free_port())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        monkeypatch.setenv("SWITCHYARD_ROUTER_PORT", str(port))
        with pytest.raises(CommandError, match=f"Port {port} .* the router cannot start"):
            call_command("up", port=free_port())


@pytest.mark.unit
def test_the_procfile_runs_the_router_and_no_fixed_model_worker(tmp_path: Path) -> None:
    """The model replicas are the autoscaler's (local actuator), not Procfile lines."""
    procfile = REPO / "platform" / "Procfile"
    assert UpCommand._processes(procfile) == ["web", "worker", "beat", "router"]
    text = procfile.read_text()
    assert "python -m runtime.gateway --host 127.0.0.1" in text
    assert '"${SWITCHYARD_ROUTER_PORT:-8080}"' in text
    assert "serve_model --" not in text
    with pytest.raises(CommandError, match="cannot read the Procfile"):
        UpCommand._processes(tmp_path / "missing")


ENV = {
    "DATABASE_URL": "postgres://u:pw@h/db",
    "REDIS_URL": "redis://h/0",
    "SWITCHYARD_VAR_DIR": "/v",
}
AT = Addresses(web="http://127.0.0.1:1", router="http://127.0.0.1:2", pool="cpu")
KEY = "sy_abcdefgh_" + "A" * 40
FIRST_RUN = {"operator_username": "operator", "operator_password": "pw",
             "api_keys": {"acme": KEY, "globex": "sy_other"}}  # fmt: skip


@pytest.mark.unit
def test_the_first_banner_shows_ready_to_paste_examples_with_the_acme_key() -> None:
    text = banner(ENV, at=AT, seed=FIRST_RUN, worker_log="/v/vllm-worker.log")
    assert "router (OpenAI)  http://127.0.0.1:2/v1" in text
    assert "model replicas   started by the autoscaler (demo-llama in pool cpu" in text
    assert "curl -N http://127.0.0.1:2/v1/chat/completions" in text
    assert f'-H "Authorization: Bearer {KEY}"' in text
    assert f'client = OpenAI(base_url="http://127.0.0.1:2/v1", api_key="{KEY}")' in text
    assert "postgres://u:***@h/db" in text


@pytest.mark.unit
def test_later_banners_and_no_worker_show_no_examples() -> None:
    later = banner(
        ENV, at=AT, seed={"operator_username": "operator", "api_keys": {}}, worker_log="/v/l"
    )
    assert "curl -N" not in later
    assert "demo data from an earlier run" in later
    assert "'Try it'" in later
    bare = Addresses(web=AT.web, router=AT.router, pool=None)
    no_worker = banner(ENV, at=bare, seed=FIRST_RUN, worker_log="/v/l")
    assert "model replicas   not started (--no-worker" in no_worker
    assert "curl -N" not in no_worker


@pytest.mark.integration
def test_a_taken_embedded_port_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, var: Path) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("SWITCHYARD_VAR_DIR", str(var))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError) as caught:
            call_command("up", port=free_port(), pg_port=port)
    assert f"Port {port} on 127.0.0.1 is already in use" in str(caught.value)
    assert "SWITCHYARD_PG_PORT" in str(caught.value)


@pytest.mark.integration
def test_a_failing_step_stops_up_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, var: Path
) -> None:
    """Nothing listens on port 1: migrate cannot connect, and `up` says which step failed."""
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:1/nothing")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("SWITCHYARD_VAR_DIR", str(var))
    with pytest.raises(CommandError, match=r"migrate failed \(exit code 1\)"):
        call_command("up", port=free_port())


@pytest.mark.unit
def test_the_banner_hides_database_passwords() -> None:
    assert without_password("postgres://u:secret@db:5432/x") == "postgres://u:***@db:5432/x"
    assert without_password("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


@pytest.mark.integration
def test_the_model_counts_as_ready_once_the_snapshot_holds_its_endpoint_ready() -> None:
    publisher = Publisher(f"switchyard:test:up-ready:{uuid.uuid4().hex[:12]}")
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url())
    worker = "http://127.0.0.1:3"
    try:
        assert serving_endpoint(client, prefix=publisher.prefix, pool="cpu") is None
        world = World()
        world.add_model("demo-llama", 1)
        world.add_endpoint(1, 1, worker, state="starting")
        publisher.publish(world.snapshot())
        assert serving_endpoint(client, prefix=publisher.prefix, pool="cpu") is None
        world.add_endpoint(1, 1, worker, state="ready")
        version = publisher.publish(world.snapshot())
        assert serving_endpoint(client, prefix=publisher.prefix, pool="cpu") == (version, worker)
        assert serving_endpoint(client, prefix=publisher.prefix, pool="gpu") is None
    finally:
        client.close()
        publisher.cleanup()
    broken: redis.Redis[bytes] = redis.Redis.from_url("redis://127.0.0.1:1/0")
    assert serving_endpoint(broken, prefix="p", pool="cpu") is None  # Redis down: not ready


@pytest.mark.integration
def test_model_ready_means_it_answered_a_request_not_only_a_ready_record(tmp_path: Path) -> None:
    """A stale ``ready`` record (its worker is gone) is not enough: the model must answer."""
    sim = start_simulator("demo-llama")
    publisher = Publisher(f"switchyard:test:up-answers:{uuid.uuid4().hex[:12]}")
    router = start_router(publisher.prefix, tmp_path)
    try:
        world = World()
        world.add_model("demo-llama", 1)
        world.add_tenant("acme")
        key = world.add_key("acme", "acme")
        stale = f"http://127.0.0.1:{free_port()}"  # nothing answers there
        for worker, expected in ((stale, False), (sim.base_url, True)):
            world.endpoints.clear()
            world.add_endpoint(1, 1, worker, state="ready")
            wait_ready(router, publisher.publish(world.snapshot()))
            at = Addresses(web="http://127.0.0.1:1", router=router.base_url, pool="cpu")
            for api_key in (None, key):  # at the worker (later runs); through the router
                found, release = checks(
                    at, redis_url=redis_url(), snapshot_prefix=publisher.prefix, api_key=api_key
                )
                try:
                    assert found[2].probe() is expected, (worker, api_key)
                finally:
                    release()
        assert "answered a request through the router" in found[2].ready
    finally:
        router.stop()
        sim.stop()
        publisher.cleanup()


# --- end to end -------------------------------------------------------------------------------


def get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            body = response.read().decode(errors="replace")
            return response.status, response.headers.get("Content-Type", ""), body
    except urllib.error.HTTPError as exc:
        return exc.code, "", ""


def trusting(var: Path) -> ssl.SSLContext:
    """A client context trusting the CA ``up --tls`` made in ``var``."""
    return ssl.create_default_context(cafile=var / "tls" / "ca.pem")


def banner_python_example(output: str) -> str:
    """The Python example the first banner printed, as a script."""
    block = output.split(".venv/bin/python - <<'EOF'\n", 1)[1].split("\n    EOF", 1)[0]
    return textwrap.dedent(block)


def planted_in_logs(var: Path, secret: str) -> list[str]:
    """The log files under ``var`` that show ``secret``: ``up``'s own output (every Procfile
    process writes there: web, Celery worker and beat, router), the replicas' and engines'
    logs (``log/``), the embedded servers' logs."""
    logs = {p for p in var.rglob("*.log") if p.is_file()}
    logs |= {p for p in (var / "log").rglob("*") if p.is_file()}
    assert any(p.name.startswith("up-") for p in logs), sorted(map(str, logs))
    return sorted(str(p) for p in logs if secret.encode() in p.read_bytes())


def run_a_batch(base_url: str, key: str) -> None:
    """The Batch API through `up` (docs/user-guide/batch-api.md): the openai client uploads
    two requests, creates a batch, polls it to completed (beat's executor tick sends the lines
    to this router and the vLLM engine) and reads the output by custom_id."""
    lines = [{"custom_id": f"q{i}", "method": "POST", "url": "/v1/chat/completions",
              "body": {"model": "demo-llama", "max_tokens": 4,
                       "messages": [{"role": "user", "content": f"Count to {i}"}]}}
             for i in (1, 2)]  # fmt: skip
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    with openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60) as client:
        upload = client.files.create(file=("in.jsonl", content), purpose="batch")
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")  # fmt: skip
        done = eventually(
            lambda: (b := client.batches.retrieve(batch.id)).status != "in_progress" and b,
            timeout=120, interval=0.5, what="the batch through up",
        )  # fmt: skip
        assert done.status == "completed", done
        assert done.output_file_id is not None
        text = client.files.content(done.output_file_id).text
        output = [json.loads(x) for x in text.splitlines()]
        assert sorted(e["custom_id"] for e in output) == ["q1", "q2"]
        assert all(e["response"]["body"]["choices"][0]["message"]["content"] for e in output)


@pytest.mark.e2e
def test_up_runs_the_platform_streams_the_model_and_stops_every_process(var: Path) -> None:
    ports = {"port": free_port(), "router-port": free_port(),
             "pg-port": free_port(), "redis-port": free_port()}  # fmt: skip
    web, router = ports["port"], ports["router-port"]
    started = time.monotonic()
    secret = f"PLANTED-{uuid.uuid4().hex}"

    first = PlatformUp(var, ports=ports)
    try:
        admin_s = first.wait_ready()
        status, _type, page = get(f"http://127.0.0.1:{web}/admin/login/")
        assert status == 200
        assert "Django administration" in page or "Switchyard" in page
        css = re.search(r'href="([^"]*/static/admin/css/base\.css)"', page)
        assert css is not None, page[:2000]
        status, content_type, body = get(f"http://127.0.0.1:{web}{css.group(1)}")
        assert (status, content_type.split(";")[0]) == (200, "text/css")
        assert "body" in body

        model_s = first.wait_model_ready()
        key = re.search(rf"API key acme\s+({KEY_RE})", first.output)
        assert key is not None, first.output[-4000:]
        with openai.OpenAI(
            base_url=f"http://127.0.0.1:{router}/v1", api_key=key.group(1), max_retries=0,
            timeout=60,
        ) as client:  # fmt: skip
            stream = client.chat.completions.create(
                model="demo-llama",
                messages=[{"role": "user", "content": "Hello!"}],
                max_tokens=8,
                stream=True,
                stream_options={"include_usage": True},
            )
            chunks = list(stream)
            # A planted secret, unary and streamed: no process's log may show it (#31).
            planted = [{"role": "user", "content": f"my passphrase is {secret}"}]
            client.chat.completions.create(model="demo-llama", messages=planted, max_tokens=4)
            list(client.chat.completions.create(model="demo-llama", messages=planted,
                                                max_tokens=4, stream=True))  # fmt: skip
        deltas = [c.choices[0].delta.content for c in chunks if c.choices]
        assert len([d for d in deltas if d]) >= 2, deltas
        assert chunks[-1].usage is not None
        assert chunks[-1].usage.completion_tokens > 0
        run_a_batch(f"http://127.0.0.1:{router}/v1", key.group(1))
        # The banner's Python example, pasted as it is, streams too.
        example = subprocess.run(
            [sys.executable, "-c", banner_python_example(first.output)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert example.returncode == 0, example.stderr
        assert "CompletionUsage(completion_tokens=32" in example.stdout

        names = first.names()
        for expected in ("postgres", "redis-server", "uvicorn", "worker", "beat",
                         "runtime.gateway", "serve_model", "vllm.entrypoints.openai.api_server",
                         "VLLM::EngineCore"):  # fmt: skip
            assert expected in names, expected
        code = first.stop("ctrl-c")
    finally:
        if first.proc.poll() is None:
            first.kill()
    first_s = time.monotonic() - started
    assert code == 0, first.output[-4000:]
    assert first.leftovers() == []
    assert planted_in_logs(var, secret) == []
    output = first.output
    assert re.search(r"operator login\s+operator / \S+", output)
    assert re.search(rf"API key globex\s+{KEY_RE}", output)
    assert f"ready: http://127.0.0.1:{web}/admin/" in output
    assert f"router ready: http://127.0.0.1:{router}/v1" in output
    assert f"curl -N http://127.0.0.1:{router}/v1/chat/completions" in output

    # A second run reuses the data: nothing new is seeded, no secret is printed again. Without
    # the worker it is quick (a second vLLM start would double this test's time). With --tls:
    # the control plane and the router serve HTTPS with the local CA it makes and prints.
    second = PlatformUp(var, ports=ports, args=("--no-worker", "--tls"))
    try:
        second.wait_for(
            "admin answers over HTTPS",  # the CA exists once `up` made it
            lambda: get(f"https://localhost:{web}/admin/login/", trusting(var))[0] == 200,
            READY_TIMEOUT_S,
        )
        second.wait_for(
            "router ready",
            lambda: get(f"https://127.0.0.1:{router}/readyz", trusting(var))[0] == 200,
            60.0,
        )
        with urllib.request.urlopen(
            f"https://127.0.0.1:{web}/admin/login/", timeout=5, context=trusting(var)
        ) as page:
            assert page.headers["Strict-Transport-Security"] == "max-age=3600"
            cookies = page.headers.get_all("Set-Cookie") or []
        csrf = [c for c in cookies if c.startswith("csrftoken=")]
        assert csrf, cookies
        assert "; secure" in csrf[0].lower(), csrf
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            get(f"https://127.0.0.1:{router}/readyz")  # the system's CAs do not know it
        assert "serve_model" not in second.names()
        # up's own readiness watcher prints its line on its next poll: wait for it (bounded)
        second.wait_for(
            "up's router-ready line",
            lambda: f"router ready: https://127.0.0.1:{router}/v1" in second.output,
            30.0,
        )
        code = second.stop("sigint")
    finally:
        if second.proc.poll() is None:
            second.kill()
    assert code == 0, second.output[-4000:]
    assert second.leftovers() == []
    assert "demo data from an earlier run" in second.output
    assert "model replicas   not started (--no-worker" in second.output
    assert not re.search(r"sy_[a-z0-9]{8}_", second.output)
    assert "operator login   operator /" not in second.output
    assert "initdb" not in (var / "postgres.log").read_text().split("starting PostgreSQL")[-1]
    assert f"TLS: made the local CA and certificate in {var / 'tls'}" in second.output
    assert f"curl --cacert {var / 'tls' / 'ca.pem'} https://127.0.0.1:{router}" in second.output
    assert f"router ready: https://127.0.0.1:{router}/v1" in second.output
    print(  # shown with -s: where the time goes
        f"first run: admin {admin_s:.0f} s, model ready {model_s:.0f} s later, "
        f"{first_s:.0f} s to stopped; whole test {time.monotonic() - started:.0f} s"
    )


@pytest.mark.integration
@pytest.mark.timeout(400)
def test_up_restarts_a_killed_process_and_the_embedded_redis_and_stops_them_all(
    var: Path,
) -> None:
    """`up` with stand-in processes: kill -9 of one, then of the embedded Redis; both come back,
    the other process is untouched, and Ctrl-C still stops everything."""
    procfile = var / "Procfile"
    sleeper = "python -c \"import time; print('{0} up', flush=True); time.sleep(600)\""
    procfile.write_text(f"steady: {sleeper.format('steady')}\nother: {sleeper.format('other')}\n")
    ports = {"port": free_port(), "router-port": free_port(), "pg-port": free_port(),
             "redis-port": free_port()}  # fmt: skip
    up = PlatformUp(var, ports=ports, args=("--no-worker", "--procfile", str(procfile)))

    def pid_of(needle: str) -> int | None:
        found = up.find(re.escape(needle))
        return found[0] if found else None

    try:
        up.wait_for("both stand-ins", lambda: up.output.count(" up\n") >= 2, READY_TIMEOUT_S)
        steady, other = pid_of("'steady up'"), pid_of("'other up'")
        assert steady is not None, up.output[-3000:]
        assert other is not None, up.output[-3000:]
        os.kill(steady, signal.SIGKILL)
        took = up.wait_for("steady restarted", lambda: up.output.count("steady up") == 2, 30.0)
        assert "steady exited with code -9; restarting it in 1 s" in up.output
        assert pid_of("'other up'") == other  # untouched
        redis_pid = pid_of("redis-server")
        assert redis_pid is not None
        os.kill(redis_pid, signal.SIGKILL)
        redis_s = up.wait_for("redis restarted", lambda: "redis restarted" in up.output, 30.0)
        assert pid_of("redis-server") not in (None, redis_pid)
        code = up.stop("ctrl-c")
    finally:
        if up.proc.poll() is None:
            up.kill()
    print(f"\nunder up: a process back {took:.1f} s after kill -9, Redis {redis_s:.1f} s")
    assert code == 0, up.output[-4000:]
    assert up.leftovers() == []
