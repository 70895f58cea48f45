"""``manage.py up`` (also ``switchyard up``): the whole platform on one machine.

Starts embedded PostgreSQL / Redis for whichever of DATABASE_URL / REDIS_URL is unset (data under
SWITCHYARD_VAR_DIR, default ./var, reused by the next run), migrates, collects static files, seeds
the demo once, then runs the Procfile's processes (config/Procfile, package data) under our
supervisor (config.supervise) — control plane, Celery worker and beat, the router. The model
replicas are the autoscaler's: beat's tick runs the local actuator
(SWITCHYARD_SCALING_ACTUATOR=local), which starts ``serve_model`` / ``serve_encoder`` for the demo
pools within their min/max (``--no-worker``: autoscaling off, no replica). A process that exits is
restarted with backoff (the embedded PostgreSQL and Redis too); the others keep running. Ctrl-C or
SIGTERM stop every process, then the replicas (``stop_replicas``; also run at start for replicas a
killed ``up`` left), the embedded servers last. Each step runs as a child process with the
services' URLs in its environment (this process's own settings were read before the servers
existed). A background thread says when the admin, the router and the demo model are ready
(apps.core.up_console).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, NoReturn

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.core import up_console
from apps.scaling.tasks import ENV_ACTUATOR
from config import paths
from config import tls as config_tls
from config.embedded import PortInUseError, ServiceStartError, port_from_env, switchyard_env
from config.processes import ManagedServer
from config.supervise import Command as SupervisedCommand
from config.supervise import Server, Supervisor, procfile_entries
from runtime import tls as runtime_tls
from runtime.procs import (
    LIFELINE_ENV,
    ensure_port_free,
    lifeline_strays,
    spawn,
    stop_group,
    stop_pid,
)
from runtime.snapshot_store import DEFAULT_PREFIX

DEFAULT_PORT = 8000
DEFAULT_ROUTER_PORT = 8080
DEMO_POOL = "cpu"  # the demo model's pool (apps.core.demo_seed)
STOP_REPLICAS_TIMEOUT_S = 90.0
STRAY_GRACE_S = 10.0  # a replica started during shutdown: its SIGTERM path, then SIGKILL


def _interrupt(_signum: int, _frame: object) -> NoReturn:
    raise KeyboardInterrupt


# option -> (what listens there, the variable that sets its default, the default)
PORTS = {
    "port": ("the control plane", "SWITCHYARD_WEB_PORT", DEFAULT_PORT),
    "router_port": ("the router", "SWITCHYARD_ROUTER_PORT", DEFAULT_ROUTER_PORT),
}


class Command(BaseCommand):
    help = "Run the whole Switchyard platform on this machine (Ctrl-C stops every process)."
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: CommandParser) -> None:
        for option, (what, variable, default) in PORTS.items():
            parser.add_argument(
                f"--{option.replace('_', '-')}",
                type=int,
                help=f"port of {what} on 127.0.0.1 (default {variable} or {default})",
            )
        parser.add_argument(
            "--no-worker",
            action="store_true",
            help="start no model replica: autoscaling off (a quicker start without the models)",
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
            "--tls",
            action="store_true",
            help="HTTPS for the control plane and the router, mTLS to the model replicas, with "
            "a local CA and certificate made once under the var directory's tls/ (printed: how "
            "to trust it)",
        )
        parser.add_argument(
            "--procfile",
            type=Path,
            default=paths.procfile(),
            help="the Procfile whose processes up runs (default: the package's config/Procfile)",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        ports: dict[str, tuple[str, int]] = {}
        for option, (what, variable, default) in PORTS.items():
            port = options[option]
            if port is None:
                try:
                    port = port_from_env(os.environ, variable, default)
                except ServiceStartError as exc:
                    raise CommandError(str(exc)) from exc
            ports[f"--{option.replace('_', '-')}"] = (what, port)
        self._check_ports(ports)
        previous = signal.signal(signal.SIGTERM, _interrupt)
        servers: list[ManagedServer] = []
        try:
            with switchyard_env(
                pg_port=options["pg_port"],
                redis_port=options["redis_port"],
                announce=self._note,
                started=servers,
            ) as env:
                code = self._run(
                    env,
                    ports={flag: port for flag, (_what, port) in ports.items()},
                    procfile=options["procfile"],
                    servers=servers,
                    autoscale=not options["no_worker"],
                    tls=options["tls"],
                )
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

    @staticmethod
    def _check_ports(ports: dict[str, tuple[str, int]]) -> None:
        seen: dict[int, str] = {}
        for flag, (what, port) in ports.items():
            if not 0 < port < 65536:
                raise CommandError(f"{flag} {port} is not a TCP port number (1-65535)")
            if port in seen:
                raise CommandError(
                    f"{flag} and {seen[port]} are both {port}; every process needs its own port"
                )
            seen[port] = flag
            try:
                ensure_port_free(port, what=what, hint=f"pass {flag} N")
            except PortInUseError as exc:
                raise CommandError(str(exc)) from exc

    def _note(self, message: str) -> None:
        self.stdout.write(f"switchyard: {message}")
        self.stdout.flush()

    def _run(
        self,
        env: dict[str, str],
        *,
        ports: dict[str, int],
        procfile: Path,
        servers: list[ManagedServer],
        autoscale: bool,
        tls: bool = False,
    ) -> int:
        base_dir = paths.SOURCE_ROOT  # the checkout, or site-packages
        web, router = ports["--port"], ports["--router-port"]
        env = {
            **env,
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
            "PYTHONUNBUFFERED": "1",
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "SWITCHYARD_WEB_PORT": str(web),
            "SWITCHYARD_ROUTER_PORT": str(router),
            "PORT": str(web),
            # The Batch API: the router forwards files and batches to the control plane, the
            # executor sends lines to the router; one secret signs what the router forwards.
            "SWITCHYARD_CONTROL_PLANE_URL": f"http://127.0.0.1:{web}",
            "SWITCHYARD_BATCH_ROUTER_URL": f"http://127.0.0.1:{router}",
            "SWITCHYARD_INTERNAL_SECRET": env.get("SWITCHYARD_INTERNAL_SECRET")
            or secrets.token_hex(32),
        }
        env[LIFELINE_ENV] = str(os.getpid())  # replicas stop once `up` is gone (kill -9 too)
        if autoscale:
            env[ENV_ACTUATOR] = "local"
        else:
            env.pop(ENV_ACTUATOR, None)
        names = self._processes(procfile)
        commands = procfile_entries(procfile.read_text())
        manage = paths.manage_command()  # no manage.py needed: an installed wheel has none
        self._step(env, [*manage, "migrate", "--noinput"], "migrate")
        self._step(
            env, [*manage, "collectstatic", "--noinput", "--verbosity", "0"], "collectstatic"
        )
        seed = self._seed(env, manage)
        self._stop_replicas(env, manage)  # left by an earlier run that was killed
        pki = self._tls(env, web=web, router=router) if tls else None
        scheme = "https" if env.get(runtime_tls.ENV_CERT) else "http"
        try:
            client_tls = runtime_tls.upstream_context(env) if scheme == "https" else None
        except runtime_tls.TLSConfigError as exc:
            raise CommandError(str(exc)) from exc
        at = up_console.Addresses(
            web=f"{scheme}://127.0.0.1:{web}",
            router=f"{scheme}://127.0.0.1:{router}",
            pool=DEMO_POOL if autoscale else None,
            ca=None if pki is None else str(pki.ca),
            tls=client_tls,
        )
        worker_log = str(Path(env["SWITCHYARD_VAR_DIR"]) / "log" / "replicas")
        self.stdout.write(up_console.banner(env, at=at, seed=seed, worker_log=worker_log))
        if pki is not None:
            self.stdout.write("\n".join(config_tls.trust_lines(pki, router=at.router)))
        self.stdout.flush()
        pending, release = up_console.checks(
            at,
            redis_url=env["REDIS_URL"],
            snapshot_prefix=env.get("SWITCHYARD_SNAPSHOT_PREFIX") or DEFAULT_PREFIX,
            api_key=(seed.get("api_keys") or {}).get("acme"),
        )
        stop = threading.Event()
        watcher = threading.Thread(
            target=up_console.announce_ready, args=(pending, self._note, stop), daemon=True
        )
        watcher.start()
        lock = threading.Lock()
        units = [
            SupervisedCommand(
                name=name, command=commands[name], env=env, cwd=base_dir, out=sys.stdout, lock=lock
            )
            for name in names
        ]
        supervisor = Supervisor([*units, *(Server(server) for server in servers)], note=self._note)
        try:
            supervisor.run(threading.Event())  # until Ctrl-C or SIGTERM (KeyboardInterrupt)
            return 0
        finally:
            stop.set()
            watcher.join(5.0)
            release()
            # The Celery worker is stopped; stop the replicas it started (they outlive it)
            # while PostgreSQL and Redis still run, so their endpoints end up gone.
            self._stop_replicas(env, manage)
            self._stop_strays()

    def _tls(self, env: dict[str, str], *, web: int, router: int) -> config_tls.LocalPKI:
        """``--tls``: the local CA and certificate (made on the first run) in ``env``."""
        pki, made = config_tls.ensure_local_pki(Path(env["SWITCHYARD_VAR_DIR"]))
        verb = "made" if made else "using"
        self._note(f"TLS: {verb} the local CA and certificate in {pki.directory}")
        env.update(config_tls.up_environ(pki, env, web_port=web, router_port=router))
        return pki

    @staticmethod
    def _processes(procfile: Path) -> list[str]:
        """The Procfile's process names up starts."""
        try:
            return list(procfile_entries(procfile.read_text()))
        except OSError as exc:
            raise CommandError(f"cannot read the Procfile {procfile}: {exc.strerror}") from exc

    def _stop_replicas(self, env: dict[str, str], manage: list[str]) -> None:
        """``manage.py stop_replicas`` in its own group (a second Ctrl-C does not cut it),
        bounded; a failure is said, not raised (shutdown goes on)."""
        proc = spawn([*manage, "stop_replicas"], env=env, death_signal=None)
        try:
            code = proc.wait(STOP_REPLICAS_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            stop_group(proc, grace_s=1.0)
            code = None
        if code != 0:
            self._note(f"stopping the model replicas failed (exit code {code})")

    def _stop_strays(self) -> None:
        """SIGTERM, then SIGKILL after a bound, to replicas launched under this ``up`` that
        ``stop_replicas`` did not know of (a tick was starting one as ``up`` stopped). The
        list holds their children too; those a parent's stop already ended go at once."""
        strays = lifeline_strays(os.getpid())
        if not strays:
            return
        self._note(f"stopping {len(strays)} replica process(es) started during shutdown ...")
        for pid in strays:
            stop_pid(pid, signal.SIGTERM, timeout=STRAY_GRACE_S)

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
