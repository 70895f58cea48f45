"""SECRET_KEY: required outside DEBUG (a clear error naming it when missing, no public
default); `up` generates one into its var directory on its first run and keeps it (0600);
the settings of every process pointed at that var directory read it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from config import secret_key

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
PRINT_KEY = "from django.conf import settings; print(settings.SECRET_KEY)"


def _env(var: Path, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"SECRET_KEY", "SECRET_KEY_FILE", "DEBUG", "DJANGO_SETTINGS_MODULE"}
    }
    return {**env, "SWITCHYARD_VAR_DIR": str(var), "PYTHONPATH": str(REPO), **extra}


def _manage(var: Path, *argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(REPO / "manage.py"), *argv],
        env=_env(var, **extra),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _run(var: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        env=_env(var, CELERY_BROKER_URL="redis://127.0.0.1:9/0"),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def test_no_key_outside_debug_is_no_public_default(tmp_path: Path) -> None:
    with pytest.raises(secret_key.SecretKeyError, match="SECRET_KEY is not set"):
        secret_key.resolve({}, tmp_path, debug=False)
    key, problem = secret_key.settings_key({}, tmp_path, debug=False)
    assert key == ""
    assert problem.startswith("SECRET_KEY is not set")
    done = _manage(tmp_path, "shell", "-c", PRINT_KEY)  # Django refuses an empty key
    assert done.returncode != 0
    assert "SECRET_KEY setting must not be empty" in done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        pytest.param(["manage.py", "check"], id="manage.py"),
        pytest.param(["-c", "import config.asgi"], id="web"),
        pytest.param(["-m", "celery", "-A", "config", "beat"], id="beat"),
        pytest.param(["-m", "celery", "-A", "config", "worker", "--pool", "solo"], id="worker"),
    ],
)
def test_every_serving_process_refuses_to_start_naming_the_variable(
    tmp_path: Path, argv: list[str]
) -> None:
    done = _run(tmp_path, *argv)
    assert done.returncode != 0
    assert "SECRET_KEY is not set" in done.stdout + done.stderr


def test_debug_and_explicit_keys(tmp_path: Path) -> None:
    assert secret_key.resolve({}, tmp_path, debug=True) == secret_key.DEBUG_KEY
    assert secret_key.resolve({"SECRET_KEY": "from-env"}, tmp_path, debug=False) == "from-env"
    held = tmp_path / "held"
    held.write_text("k" * 40 + "\n")
    assert secret_key.resolve({"SECRET_KEY_FILE": str(held)}, tmp_path, debug=False) == "k" * 40
    held.write_text("short")
    with pytest.raises(secret_key.SecretKeyError, match="shorter than"):
        secret_key.resolve({"SECRET_KEY_FILE": str(held)}, tmp_path, debug=False)


def test_ensure_generates_once_private_and_keeps_it(tmp_path: Path) -> None:
    path = secret_key.ensure(tmp_path / "var")
    first = path.read_text()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert len(first.strip()) >= secret_key.MIN_LENGTH
    path.chmod(0o644)
    assert secret_key.ensure(tmp_path / "var") == path
    assert path.read_text() == first
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert secret_key.resolve({}, tmp_path / "var", debug=False) == first.strip()


def test_up_generates_the_key_on_its_first_run_and_keeps_it(tmp_path: Path) -> None:
    """`manage.py up` makes the key before settings load (here its --help: nothing starts);
    the next run keeps it; a `manage.py` command on the same var directory uses it."""
    path = tmp_path / "secret_key"
    assert _manage(tmp_path, "up", "--help").returncode == 0
    key = path.read_text().strip()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert _manage(tmp_path, "up", "--help").returncode == 0
    assert path.read_text().strip() == key
    shown = _manage(tmp_path, "shell", "-c", PRINT_KEY)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.strip().splitlines()[-1] == key


def test_switchyard_up_generates_the_key_too(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", "from config.cli import main; main(['up', '--help'])"],
        env=_env(tmp_path),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "secret_key").is_file()


def test_an_explicit_key_is_not_replaced_by_a_file(tmp_path: Path) -> None:
    assert _manage(tmp_path, "up", "--help", SECRET_KEY="x" * 40).returncode == 0
    assert not (tmp_path / "secret_key").exists()
