"""``bare-proxy``: a minimal aiohttp reverse proxy, the requests/s-per-core reference.

It does only what any proxy must (accept, pick a backend round robin, forward, stream the
answer back chunk by chunk), pinned to the same single core a router gets. A router's
requests/s per core is compared with this one's in the same run.

``transport-proxy`` is the same target with another server module
(:mod:`bench.transport_proxy`): the router's own transport (uvicorn, uvloop, httptools and
the router's lean upstream client) doing only that, none of the router's logic.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.procs import free_port, pinned, spawn, wait_http
from bench.targets.base import REPO_ROOT, Target, TargetContext, python_argv, python_env, warm_up


@dataclass
class BareProxyTarget(Target):
    module: str = "bench.proxy_server"  # ``python -m`` it with --host, --port, --backend...
    kind: str = "bare aiohttp reverse proxy (uvloop), round robin"

    async def start(self, ctx: TargetContext) -> None:
        port = free_port()
        backends = [arg for url in ctx.backend_urls for arg in ("--backend", url)]
        argv = pinned(
            python_argv(self.module, "--host", "127.0.0.1", "--port", str(port),
                        *backends),
            ctx.router_cpus,
        )  # fmt: skip
        child = spawn(self.name, argv, port=port, log_dir=ctx.work_dir, env=python_env(),
                      cwd=REPO_ROOT)  # fmt: skip
        self.children.append(child)
        await wait_http(child, ctx.session, "/healthz", timeout_s=ctx.start_timeout_s)
        await warm_up(ctx.session, child.base_url, model=ctx.scenario.backends.model,
                      headers={}, count=3, timeout_s=ctx.start_timeout_s, child=child)  # fmt: skip
        self.base_urls = [child.base_url]
        self.info = {
            "kind": self.kind,
            "cpus": list(ctx.router_cpus),
        }
