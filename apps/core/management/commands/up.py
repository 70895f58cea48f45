"""``manage.py up`` (also ``switchyard up``): the whole platform on one machine.

Starts embedded PostgreSQL / Redis for whichever of DATABASE_URL / REDIS_URL is unset (data under
SWITCHYARD_VAR_DIR, default ./var, reused by the next run), migrates, collects static files, seeds
the demo once, then runs platform/Procfile under honcho until Ctrl-C or SIGTERM, which stop every
process, the embedded servers last. Each step runs as a child process with the services' URLs in
its environment (this process's own settings were read before the servers existed).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, NoReturn
from urllib.parse import urlsplit, urlunsplit

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from config.embedded import PortInUseError, ServiceStartError, switchyard_env
from config.processes import ensure_port_free, run_child

DEFAULT_PORT = 8000
READY_TIMEOUT_S = 120.0
HONCHO_KILL_AFTER_S = 30.0


def _interrupt(_signum: int, _frame: object) -> NoReturn:
    raise KeyboardInterrupt


def _without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class Command(BaseCommand):
    help = "Run the whole Switchyard platform on this machine (Ctrl-C stops every process)."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--port",
            type=int,
            default=int(os.environ.get("SWITCHYARD_WEB_PORT") or DEFAULT_PORT),
            help=f"control-plane port on 127.0.0.1 (default {DEFAULT_PORT})",
        )
        parser.add_argument(
            "--pg-port",
            type=int,
            help="embedded PostgreSQL port (default 54329, SWITCHYARD_PG_PORT)",
        )
        parser.add_argument(
            "--redis-port",
            type=int,
            help="embedded Redis port (default 63799, SWITCHYARD_REDIS_PORT)",
        )
        parser.add_argument(
            "--procfile",
            type=Path,
            default=Path(settings.BASE_DIR) / "platform" / "Procfile",
            help="the Procfile honcho runs (default platform/Procfile)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        port: int = options["port"]
        try:
            ensure_port_free(port, what="the control plane", hint="pass --port N")
        except PortInUseError as exc:
            raise CommandError(str(exc)) from exc
        previous = signal.signal(signal.SIGTERM, _interrupt)
        try:
            with switchyard_env(
                pg_port=options["pg_port"], redis_port=options["redis_port"], announce=self._note
            ) as env:
                code = self._run(env, port=port, procfile=options["procfile"])
        except ServiceStartError as exc:
            raise CommandError(str(exc)) from exc
        except KeyboardInterrupt:
            self._note("interrupted; every process stopped")
            return
        finally:
            signal.signal(signal.SIGTERM, previous)
        if code not in (0, 130, 143):
            raise CommandError(f"the platform stopped with exit code {code} (see the output above)")
        self._note("stopped")

    def _note(self, message: str) -> None:
        self.stdout.write(f"switchyard: {message}")
        self.stdout.flush()

    def _run(self, env: dict[str, str], *, port: int, procfile: Path) -> int:
        base_dir = Path(settings.BASE_DIR)
        env = {
            **env,
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "SWITCHYARD_WEB_PORT": str(port),
            "PORT": str(port),
        }
        manage = [sys.executable, str(base_dir / "manage.py")]
        self._step(env, [*manage, "migrate", "--noinput"], "migrate")
        self._step(
            env, [*manage, "collectstatic", "--noinput", "--verbosity", "0"], "collectstatic"
        )
        seed = self._seed(env, manage)
        self._banner(env, port=port, seed=seed)
        ready = threading.Event()
        watcher = threading.Thread(target=self._announce_ready, args=(port, ready), daemon=True)
        watcher.start()
        honcho = [sys.executable, "-m", "honcho", "-f", str(procfile), "-d", str(base_dir)]
        try:
            return run_child(
                [*honcho, "start", "-p", str(port)],
                env=env,
                cwd=base_dir,
                kill_after=HONCHO_KILL_AFTER_S,
            )
        finally:
            ready.set()

    def _step(self, env: dict[str, str], argv: list[str], name: str) -> None:
        self._note(f"{name} ...")
        done = subprocess.run(argv, env=env, check=False)  # noqa: S603
        if done.returncode != 0:
            raise CommandError(f"{name} failed (exit code {done.returncode}); see the output above")

    def _seed(self, env: dict[str, str], manage: list[str]) -> dict[str, Any]:
        self._note("seeding the demo data that is missing ...")
        done = subprocess.run(  # noqa: S603
            [*manage, "seed_demo", "--json"],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise CommandError(f"seeding the demo failed (exit code {done.returncode})")
        lines = done.stdout.strip().splitlines()
        if not lines:
            raise CommandError("seeding the demo printed no result")
        result: dict[str, Any] = json.loads(lines[-1])
        return result

    def _banner(self, env: dict[str, str], *, port: int, seed: dict[str, Any]) -> None:
        web = f"http://127.0.0.1:{port}"
        lines = [
            "Switchyard",
            f"  admin            {web}/admin/",
            f"  OpenAPI schema   {web}/api/schema/",
            f"  PostgreSQL       {_without_password(env['DATABASE_URL'])}",
            f"  Redis            {_without_password(env['REDIS_URL'])}",
            f"  data             {env['SWITCHYARD_VAR_DIR']}",
        ]
        if seed.get("operator_password"):
            lines += [
                "",
                "  Shown once, not stored in clear anywhere: write them down now.",
                f"  operator login   {seed['operator_username']} / {seed['operator_password']}",
            ]
            lines += [f"  API key {slug:<8} {key}" for slug, key in seed["api_keys"].items()]
        else:
            lines += [
                "",
                f"  demo data from an earlier run (operator login: {seed['operator_username']});",
                "  its password and API keys were shown then. Make new keys in the admin.",
            ]
        lines += ["", "  Ctrl-C stops every process."]
        rule = "=" * 72
        self.stdout.write("\n".join([rule, *lines, rule]))
        self.stdout.flush()

    def _announce_ready(self, port: int, stop: threading.Event) -> None:
        url = f"http://127.0.0.1:{port}/admin/login/"
        deadline = READY_TIMEOUT_S
        while not stop.wait(0.5) and deadline > 0:
            deadline -= 0.5
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    if response.status == 200:
                        self._note(f"ready: {url.removesuffix('login/')}")
                        return
            except (urllib.error.URLError, OSError):
                continue
