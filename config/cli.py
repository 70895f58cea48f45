"""The ``switchyard`` console script.

    switchyard up [--port N] [--router-port N] [--no-worker] [--pg-port N] [--redis-port N]
        The whole platform on this machine (control plane, Celery, the router; the autoscaler's
        local actuator starts the demo model's vLLM CPU replicas and the encoder's, --no-worker:
        none); the same as ``switchyard manage up``.
    switchyard manage COMMAND [ARG ...]
        Any Django management command (migrate, collectstatic, createsuperuser, serve_model, ...):
        ``manage.py`` for an installed package (the same as ``python -m config.manage``).
    switchyard embedded [--var-dir DIR] [--pg-port N] [--redis-port N] -- CMD [ARG ...]
        Start embedded PostgreSQL / Redis for whichever of DATABASE_URL / REDIS_URL is unset, run
        CMD with those URLs in its environment, stop the servers, exit with CMD's exit code.
        The test command is ``switchyard embedded -- pytest ...``.

``embedded`` does not need Django settings: it only imports config.embedded (plain Python).
"""

from __future__ import annotations

import argparse
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchyard", description="Switchyard: run the platform on one machine."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "up",
        help="run the whole platform (same as `switchyard manage up`; see `switchyard up --help`)",
        add_help=False,
    )
    commands.add_parser(
        "manage",
        help="a Django management command (manage.py for an installed package)",
        add_help=False,
    )
    embedded = commands.add_parser(
        "embedded",
        help="run a command with embedded PostgreSQL/Redis for the unset DATABASE_URL/REDIS_URL",
    )
    embedded.add_argument(
        "--var-dir", type=Path, help="data directory (default SWITCHYARD_VAR_DIR or ./var)"
    )
    embedded.add_argument("--pg-port", type=int, help="embedded PostgreSQL port (default 54329)")
    embedded.add_argument("--redis-port", type=int, help="embedded Redis port (default 63799)")
    embedded.add_argument("argv", nargs=argparse.REMAINDER, help="-- COMMAND [ARG ...]")
    return parser


def _interrupt(_signum: int, _frame: object) -> NoReturn:
    raise KeyboardInterrupt


def _embedded(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from config.embedded import ServiceStartError, switchyard_env  # noqa: PLC0415
    from config.processes import run_child  # noqa: PLC0415

    argv = list(args.argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        parser.error("embedded needs a command: switchyard embedded -- CMD [ARG ...]")

    def announce(message: str) -> None:
        print(f"switchyard: {message}", file=sys.stderr, flush=True)

    # SIGTERM while servers start or stop unwinds like Ctrl-C, so they are stopped either way.
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        with switchyard_env(
            var=args.var_dir, pg_port=args.pg_port, redis_port=args.redis_port, announce=announce
        ) as env:
            try:
                return run_child(argv, env=env)
            except FileNotFoundError:
                announce(f"command not found: {argv[0]}")
                return 127
    except ServiceStartError as exc:
        announce(str(exc))
        return 1
    except KeyboardInterrupt:
        announce("interrupted; embedded servers stopped")
        return 130


def _manage(argv: Sequence[str], *, prog: str = "switchyard manage") -> int:
    from config.manage import main as manage  # noqa: PLC0415

    manage([prog, *argv])
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    parser = _parser()
    if raw[:1] == ["up"]:
        return _manage(raw, prog="switchyard")  # Django's parser owns `up`'s options, --help
    if raw[:1] == ["manage"]:
        return _manage(raw[1:])  # Django's: every command, its options, its --help
    args = parser.parse_args(raw)
    return _embedded(args, parser)
