"""``vllm-router``: the Rust router from PyPI, in its own virtual environment, as a peer.

Installed by ``python -m bench setup-peers`` into ``bench/.venvs/vllm-router``; skipped with
the reason when it is not there. Round robin (or ``policy``, e.g. its ``cache_aware``) over the
same backends, pinned to the same core as the other routers (its Tokio runtime then has one
core to run on, like ours).
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.procs import free_port, pinned, spawn, wait_http
from bench.targets.base import VENVS, Target, TargetContext, TargetUnavailableError, warm_up

BINARY = VENVS / "vllm-router" / "bin" / "vllm-router"
# Run through the venv's own interpreter, not the script's shebang: the shebang names the path
# the venv was made at, so a venv copied or linked from another checkout (a deleted worktree)
# fails to start; its interpreter finds the venv from its own location.
PYTHON = VENVS / "vllm-router" / "bin" / "python"


@dataclass
class VllmRouterTarget(Target):
    policy: str = "round_robin"  # vllm-router's --policy

    async def start(self, ctx: TargetContext) -> None:
        missing = next((p for p in (BINARY, PYTHON) if not p.exists()), None)
        if missing is not None:
            raise TargetUnavailableError(
                f"not installed ({missing} is missing): run `python -m bench setup-peers "
                "--only vllm-router` in this checkout"
            )
        port, metrics_port = free_port(), free_port()
        argv = [
            str(PYTHON), str(BINARY), "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", *ctx.backend_urls, "--policy", self.policy,
            "--log-level", "warning", "--log-dir", str(ctx.work_dir / f"{self.name}-logs"),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port),
        ]  # fmt: skip
        env = {"PATH": "/usr/bin:/bin", "HOME": str(ctx.work_dir), "NO_PROXY": "*"}
        child = spawn(self.name, pinned(argv, ctx.router_cpus), port=port,
                      log_dir=ctx.work_dir, env=env)  # fmt: skip
        self.children.append(child)
        await wait_http(child, ctx.session, "/health", timeout_s=ctx.start_timeout_s)
        await warm_up(ctx.session, child.base_url, model=ctx.scenario.backends.model,
                      headers={}, count=3, timeout_s=ctx.start_timeout_s, child=child)  # fmt: skip
        self.base_urls = [child.base_url]
        self.info = {
            "kind": f"vllm-router (PyPI, Rust), --policy {self.policy}",
            "venv": str(BINARY.parent.parent),
            "cpus": list(ctx.router_cpus),
        }
