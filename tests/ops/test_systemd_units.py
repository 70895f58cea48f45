"""platform/systemd: the production units restart what dies, stop within the grace periods
they promise, and run commands that exist in this repository (checked offline: each unit's
ExecStart is parsed by the program's own argument parser); ``systemd-analyze verify`` passes
on them where that binary exists."""

from __future__ import annotations

import shlex
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
from django.core.management import get_commands, load_command_class

from config.supervise import procfile_entries
from runtime.gateway.__main__ import build_parser as router_parser

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
UNITS = REPO / "platform" / "systemd"
INSTALL = "/opt/switchyard"
SERVICES = sorted(UNITS.glob("*.service"))


def parse_unit(path: Path) -> dict[str, list[tuple[str, str]]]:
    """``section -> [(key, value), ...]`` (systemd allows a key more than once)."""
    sections: dict[str, list[tuple[str, str]]] = {}
    current: list[tuple[str, str]] | None = None
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = sections.setdefault(line[1:-1], [])
            continue
        assert current is not None, f"{path.name}: {line!r} before any section"
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not a key=value line: {line!r}"
        current.append((key.strip(), value.strip()))
    return sections


def value(unit: dict[str, list[tuple[str, str]]], section: str, key: str) -> str:
    found = [v for k, v in unit.get(section, []) if k == key]
    assert len(found) == 1, f"[{section}] {key}: {found}"
    return found[0]


def seconds(text: str) -> float:
    return float(text.removesuffix("s"))


def example_env() -> dict[str, str]:
    """The variables the example environment files (``*.env.example``) set."""
    env: dict[str, str] = {}
    for path in UNITS.glob("*.env.example"):
        for line in path.read_text().splitlines():
            name, sep, text = line.partition("=")
            if sep and not line.startswith("#"):
                env[name.strip()] = text.strip()
    return env


def exec_argv(unit: dict[str, list[tuple[str, str]]]) -> list[str]:
    """ExecStart as argv, each ``${VAR}`` replaced by its value in the example env files."""
    env = example_env()
    argv = []
    for word in shlex.split(value(unit, "Service", "ExecStart")):
        name = word[2:-1] if word.startswith("${") else None
        assert name is None or name in env, f"{name} is set by no *.env.example"
        argv.append((word if name is None else env[name]).replace("%i", "demo"))
    return argv


def _flag(argv: list[str], name: str) -> float:
    return float(argv[argv.index(name) + 1])


def check_router(argv: list[str]) -> float:
    assert argv[1:3] == ["-m", "runtime.gateway"], argv
    args = router_parser().parse_args(argv[3:])
    return float(args.graceful_shutdown_s)


def check_management(argv: list[str]) -> float:
    assert argv[1] == "manage.py", argv
    name = argv[2]
    assert name in get_commands(), f"no management command {name!r}"
    command = load_command_class(get_commands()[name], name)
    options = command.create_parser("manage.py", name).parse_args(argv[3:])
    return float(options.grace)


def check_uvicorn(argv: list[str]) -> float:
    from uvicorn import main as cli  # noqa: PLC0415 - only this check needs click's parser

    assert argv[1] == "config.asgi:application", argv
    assert (REPO / "config" / "asgi.py").read_text().count("application =") == 1
    cli.make_context("uvicorn", argv[1:])  # click parses every option
    return _flag(argv, "--timeout-graceful-shutdown")


def check_celery(argv: list[str]) -> float:
    assert argv[1:3] == ["-A", "config"], argv
    assert argv[3] in ("worker", "beat"), argv
    assert "app = Celery(" in (REPO / "config" / "celery.py").read_text().replace("app=", "app =")
    return 0.0


PROGRAMS: dict[str, Callable[[list[str]], float]] = {
    "python": lambda argv: check_management(argv) if argv[1] == "manage.py" else check_router(argv),
    "uvicorn": check_uvicorn,
    "celery": check_celery,
}


def test_every_platform_process_has_a_unit() -> None:
    """What ``up`` runs (platform/Procfile) runs in production under a unit too."""
    programs = {" ".join(exec_argv(parse_unit(path))[1:4]).split(" --")[0] for path in SERVICES}
    procfile = procfile_entries((REPO / "platform" / "Procfile").read_text())
    for name, command in procfile.items():
        argv = shlex.split(command)
        head = " ".join(argv[1:4]).split(" --")[0]
        assert head in programs, (name, head, programs)
    assert {p.name for p in SERVICES} >= {
        "switchyard-router.service", "switchyard-web.service",
        "switchyard-celery-worker.service", "switchyard-celery-beat.service",
        "switchyard-model@.service", "switchyard-encoder@.service",
    }  # fmt: skip


@pytest.mark.parametrize("path", SERVICES, ids=lambda path: path.name)
def test_a_unit_restarts_with_backoff_limits_and_stops_after_its_grace(path: Path) -> None:
    unit = parse_unit(path)
    assert value(unit, "Service", "Restart") in ("always", "on-failure")
    assert seconds(value(unit, "Service", "RestartSec")) >= 1
    assert seconds(value(unit, "Unit", "StartLimitIntervalSec")) > 0
    assert int(value(unit, "Unit", "StartLimitBurst")) >= 3
    assert value(unit, "Service", "KillMode") in ("mixed", "control-group")
    assert value(unit, "Unit", "PartOf") == "switchyard.target"
    assert value(unit, "Install", "WantedBy") == "switchyard.target"
    argv = exec_argv(unit)
    assert argv[0].startswith(f"{INSTALL}/.venv/bin/"), argv
    grace = PROGRAMS[Path(argv[0]).name](argv)
    stop_s = seconds(value(unit, "Service", "TimeoutStopSec"))
    # systemd's SIGKILL must not come before the program's own grace period is over
    assert stop_s >= grace + 5, (stop_s, grace)


def test_the_router_unit_matches_the_router_grace() -> None:
    unit = parse_unit(UNITS / "switchyard-router.service")
    grace = check_router(exec_argv(unit))
    assert grace == 30
    assert seconds(value(unit, "Service", "TimeoutStopSec")) == grace + 10
    assert value(unit, "Service", "KillMode") == "mixed"  # SIGTERM to uvicorn only


def test_a_bad_unit_is_caught() -> None:
    """The checks above can fail: a missing management command and a short stop timeout."""
    unit = parse_unit(UNITS / "switchyard-model@.service")
    argv = exec_argv(unit)
    with pytest.raises(AssertionError, match="no management command"):
        check_management([*argv[:2], "serve_nothing", *argv[3:]])
    with pytest.raises(SystemExit):  # argparse refuses an unknown flag
        check_router([argv[0], "-m", "runtime.gateway", "--graceful-shutdown", "x"])


def test_systemd_analyze_verify(tmp_path: Path) -> None:
    binary = shutil.which("systemd-analyze")
    if binary is None:
        pytest.skip("systemd-analyze is not installed here (the offline checks above ran)")
    venv_python = REPO / ".venv" / "bin" / "python"
    if not venv_python.exists():
        pytest.skip(f"{venv_python} is missing: verify checks that ExecStart exists")
    names = []
    for path in sorted([*SERVICES, *UNITS.glob("*.target")]):
        # installed at /opt/switchyard; here, this checkout plays that directory
        (tmp_path / path.name).write_text(path.read_text().replace(INSTALL, str(REPO)))
        names.append(path.name.replace("@.", "@demo."))
    result = subprocess.run(
        [binary, "verify", "--man=no", *names],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "", result.stderr  # warnings (unknown keys) too


def test_the_web_unit_collects_static_files_before_it_starts() -> None:
    """DEBUG=false: the admin's CSS is served from STATIC_ROOT only, so the web unit fills it."""
    unit = parse_unit(UNITS / "switchyard-web.service")
    pre = shlex.split(value(unit, "Service", "ExecStartPre"))
    assert pre[0] == f"{INSTALL}/.venv/bin/python", pre
    assert pre[1:4] == ["-m", "config.manage", "collectstatic"], pre
    assert "collectstatic" in get_commands()
    assert "--noinput" in pre
    assert value(unit, "Service", "Environment").startswith("SWITCHYARD_VAR_DIR=")
