"""The wheel is the product: built from the tree, installed with ``--no-deps`` into a fresh
virtual environment (its dependencies from this venv's site-packages, added by a plain path
line, so the checkout's editable install is not on the path), it carries its templates, static
files and Procfile, and its ``switchyard`` console script runs ``manage check`` and ``up
--no-worker`` from a directory outside the checkout: the admin and the dashboard's CSS answer.

The build runs on a copy of the packages (setuptools writes ``build/`` and ``*.egg-info`` beside
its sources), without build isolation (setuptools is in this venv; nothing is downloaded).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import site
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from fixtures.net import free_port
from fixtures.platform_up import http_status
from fixtures.static_assets import assert_admin_and_dashboard_assets_served

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("config", "apps", "runtime", "frontend")
PACKAGE_DATA = (
    "config/Procfile",
    "config/manage.py",
    "frontend/static/frontend/dashboard.js",
    "frontend/static/frontend/dashboard.css",
    "frontend/templates/frontend/base.html",
    "frontend/templates/registration/login.html",
)
READY_TIMEOUT_S = 150.0  # embedded PostgreSQL's initdb, migrate, collectstatic, seed
STOP_TIMEOUT_S = 60.0


def _copy_sources(dest: Path) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in PACKAGES:
        shutil.copytree(REPO / name, dest / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, dest / name)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    src = tmp_path_factory.mktemp("src")
    out = tmp_path_factory.mktemp("dist")
    _copy_sources(src)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "--no-index", "-q", "-w", str(out), str(src)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = out.glob("switchyard-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    venv_cmd = [sys.executable, "-m", "venv", "--without-pip", str(root)]
    subprocess.run(venv_cmd, check=True, timeout=60)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install",
         "--no-deps", "--no-index", "-q", str(wheel)],
        capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    (purelib,) = root.glob("lib/python*/site-packages")
    # The dependencies: this venv's site-packages as a plain path (its .pth files, the
    # editable install's finder among them, are not processed).
    (purelib / "switchyard-deps.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    return root


def _env(var: Path) -> dict[str, str]:
    """No PYTHONPATH (the checkout must not be found) and no service URLs (up starts its own);
    this venv's bin/ after the fresh one's, for the dependencies' console scripts."""
    drop = {"PYTHONPATH", "DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["SWITCHYARD_VAR_DIR"] = str(var)
    env["DEBUG"] = "false"
    return env


def test_the_wheel_carries_templates_static_files_and_the_procfile(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [name for name in PACKAGE_DATA if name not in names]
    assert not missing, f"{wheel.name} lacks {missing}"
    assert "manage.py" not in names  # the package's own config/manage.py replaces it
    metadata = (
        zipfile.ZipFile(wheel)
        .read(next(n for n in names if n.endswith(".dist-info/METADATA")))
        .decode()
    )
    assert "Requires-Python: <3.14,>=3.11" in metadata
    assert re.search(r"Requires-Dist: uvicorn\[standard\]<0\.55,>=0\.54", metadata), metadata


def test_the_installed_package_runs_outside_the_checkout(venv: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    env = _env(tmp_path / "var")
    python = str(venv / "bin" / "python")
    where = subprocess.run(
        [python, "-c", "import config, frontend; print(config.__file__, frontend.__file__)"],
        cwd=run_dir, env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert str(REPO) not in where.stdout, where.stdout
    assert str(venv) in where.stdout, where.stdout
    check = subprocess.run(
        [str(venv / "bin" / "switchyard"), "manage", "check"],
        cwd=run_dir, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert "no issues" in check.stdout


def test_switchyard_up_from_the_wheel_serves_the_admin_with_its_css(
    venv: Path, tmp_path: Path
) -> None:
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    var = tmp_path / "var"
    var.mkdir()
    web = free_port()
    flags = ["--port", str(web), "--router-port", str(free_port()),
             "--pg-port", str(free_port()), "--redis-port", str(free_port())]  # fmt: skip
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(venv / "bin" / "switchyard"), "up", "--no-worker", *flags],
            cwd=run_dir, env=_env(var), stdin=subprocess.DEVNULL, stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    base = f"http://127.0.0.1:{web}"
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while http_status(f"{base}/admin/login/") != 200:
            assert proc.poll() is None, log.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
            time.sleep(0.5)
        assert_admin_and_dashboard_assets_served(base)
        assert (var / "staticfiles" / "frontend" / "dashboard.js").is_file()
        assert not (run_dir / "var").exists()  # SWITCHYARD_VAR_DIR was used
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
