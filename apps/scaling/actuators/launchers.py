"""What the local actuator runs for one replica, by name: one launcher per model runtime.

A launcher turns a :class:`LaunchSpec` (which version, which pool, which port) into a command
line. ``registers_itself`` says who registers the endpoint: the real workers (``manage.py
serve_model`` for vLLM, ``manage.py serve_encoder`` for PyTorch encoders) register their own,
heartbeat it and move it to ``ready`` after their warm-up; for the bare simulator the actuator
registers it. :data:`RUNTIME_LAUNCHERS` maps a version's runtime to a launcher name (an actuator
may override it: tests run ``serve_model`` on a simulator version).
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar, Final, Protocol

from config.paths import manage_command
from runtime.policy_names import by_name, lookup


@dataclass(frozen=True, slots=True, kw_only=True)
class LaunchSpec:
    model: str
    label: str
    pool: str
    port: int
    capacity: int | None  # None: the launcher's default
    log_dir: Path
    extra_args: tuple[str, ...] = ()
    grace_s: float = 10.0  # how long a real worker drains on SIGTERM


class Launcher(Protocol):
    name: ClassVar[str]
    registers_itself: ClassVar[bool]
    default_capacity: ClassVar[int]
    start_timeout_s: ClassVar[float]  # a cold start takes at most this long

    def argv(self, spec: LaunchSpec) -> list[str]: ...


class SimulatorLauncher:
    """The vLLM simulator alone (tests, demos without weights); the actuator registers it."""

    name: ClassVar[str] = "simulator"
    registers_itself: ClassVar[bool] = False
    default_capacity: ClassVar[int] = 8
    start_timeout_s: ClassVar[float] = 60.0

    def argv(self, spec: LaunchSpec) -> list[str]:
        return [
            sys.executable, "-m", "runtime.workers.simulator", "--model", spec.model,
            "--port", str(spec.port),
            "--max-num-seqs", str(spec.capacity or self.default_capacity),
            "--log-level", "WARNING", *spec.extra_args,
        ]  # fmt: skip


class ServeModelLauncher:
    """``manage.py serve_model``: vLLM (the version's runtime) with the worker's life cycle."""

    name: ClassVar[str] = "serve_model"
    registers_itself: ClassVar[bool] = True
    default_capacity: ClassVar[int] = 8
    start_timeout_s: ClassVar[float] = 900.0  # vLLM on a busy CPU box

    def argv(self, spec: LaunchSpec) -> list[str]:
        argv = [
            *manage_command(), "serve_model", "--model", spec.model, "--label", spec.label,
            "--pool", spec.pool, "--port", str(spec.port),
            "--capacity", str(spec.capacity or self.default_capacity),
            "--grace", str(spec.grace_s),
            "--engine-log", str(spec.log_dir / f"{spec.pool}-{spec.port}-engine.log"),
        ]  # fmt: skip
        if spec.extra_args:
            argv.append(f"--engine-args={shlex.join(spec.extra_args)}")
        return argv


class ServeEncoderLauncher:
    """``manage.py serve_encoder``: the PyTorch CPU encoder worker with its batcher."""

    name: ClassVar[str] = "serve_encoder"
    registers_itself: ClassVar[bool] = True
    default_capacity: ClassVar[int] = 16
    start_timeout_s: ClassVar[float] = 300.0

    def argv(self, spec: LaunchSpec) -> list[str]:
        return [
            *manage_command(), "serve_encoder", "--model", spec.model, "--label", spec.label,
            "--pool", spec.pool, "--port", str(spec.port),
            "--capacity", str(spec.capacity or self.default_capacity),
            "--grace", str(spec.grace_s), *spec.extra_args,
        ]  # fmt: skip


LAUNCHERS: Final = (SimulatorLauncher, ServeModelLauncher, ServeEncoderLauncher)

# A version's runtime (ModelVersion.runtime) -> the launcher that runs it.
RUNTIME_LAUNCHERS: Final[Mapping[str, str]] = MappingProxyType(
    {"vllm": "serve_model", "torch": "serve_encoder", "simulator": "simulator"}
)


def registry() -> Mapping[str, type[Any]]:
    return by_name("launcher", LAUNCHERS)


def launcher(name: str) -> Launcher:
    """A new instance of the launcher registered as ``name`` (UnknownPolicyError otherwise)."""
    found: Launcher = lookup("launcher", registry(), name)()
    return found


def launcher_for_runtime(runtime: str, overrides: Mapping[str, str] | None = None) -> Launcher:
    """The launcher of a version's ``runtime`` (``overrides`` first, then the defaults)."""
    table = {**RUNTIME_LAUNCHERS, **(overrides or {})}
    return launcher(table.get(runtime, runtime))
