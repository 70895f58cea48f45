"""The browser tests' platform pieces (a module, not conftest: test modules import them, and
every test directory has a module named ``conftest``)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from django.db import connection
from fixtures.router import REPO_ROOT, Process, World, redis_url, spawn, wait_until_up

MODEL = "sim-chat"
ADAPTER = "sim-chat-support"  # a LoRA adapter on MODEL (the fleet page shows where it is resident)


@dataclass
class Platform:
    router: Process
    web: Process
    world: World

    @property
    def web_url(self) -> str:
        return self.web.base_url


def web_env(prefix: str, var_dir: Path) -> dict[str, str]:
    """The environment of a control-plane process on this test's database and Redis."""
    settings_db = connection.settings_dict
    return {
        **os.environ,
        "DATABASE_URL": f"postgres://{settings_db['USER']}@{settings_db['HOST']}:"
        f"{settings_db['PORT']}/{settings_db['NAME']}",
        "REDIS_URL": redis_url(),
        "SWITCHYARD_SNAPSHOT_PREFIX": prefix,
        "SWITCHYARD_VAR_DIR": str(var_dir),
        "SECRET_KEY": "browser-test-secret",
        "PYTHONPATH": str(REPO_ROOT),
    }


def start_web(prefix: str, var_dir: Path) -> Process:
    """The control plane (uvicorn, the ASGI app with websockets and the live relay)."""
    env = web_env(prefix, var_dir)
    subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput", "--verbosity", "0"],
        cwd=REPO_ROOT,
        env=env,
        check=True,
        timeout=120,
    )
    web, _ = spawn(["uvicorn", "config.asgi:application", "--log-level", "warning"], env=env)
    return wait_until_up(web, "/accounts/login/")
