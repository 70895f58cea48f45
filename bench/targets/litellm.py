"""``litellm``: the LiteLLM proxy from PyPI, in its own virtual environment, as a peer.

Installed by ``python -m bench setup-peers`` into ``bench/.venvs/litellm``; skipped with the
reason when it is not there. It runs with no database (``DATABASE_URL`` and friends are
removed from its environment), a random master key (the only credential it then accepts,
which the load generator sends to it), the bundled model-cost map (no fetch) and
one worker pinned to the router core. Every backend is a deployment of the one model name,
balanced by LiteLLM's default ``simple-shuffle`` (it has no plain round robin).
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from bench.procs import free_port, pinned, spawn, wait_http
from bench.targets.base import VENVS, Target, TargetContext, TargetUnavailableError, warm_up

BINARY = VENVS / "litellm" / "bin" / "litellm"
ENV = {
    "PATH": "/usr/bin:/bin",
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOG": "ERROR",
    "LITELLM_DONT_SHOW_FEEDBACK_BOX": "true",
    "DISABLE_ADMIN_UI": "True",
    "NO_DOCS": "True",
    "NO_PROXY": "*",
}


def litellm_config(model: str, backend_urls: list[str], master_key: str) -> dict[str, object]:
    return {
        "model_list": [
            {
                "model_name": model,
                "litellm_params": {
                    "model": f"openai/{model}",
                    "api_base": f"{url.rstrip('/')}/v1",
                    "api_key": "unused",
                },
            }
            for url in backend_urls
        ],
        "router_settings": {"routing_strategy": "simple-shuffle", "num_retries": 0},
        "litellm_settings": {"drop_params": True, "request_timeout": 600},
        "general_settings": {"master_key": master_key},
    }


@dataclass
class LitellmTarget(Target):
    async def start(self, ctx: TargetContext) -> None:
        if not BINARY.exists():
            raise TargetUnavailableError(
                f"not installed ({BINARY} is missing): run `python -m bench setup-peers`"
            )
        config = ctx.work_dir / f"{self.name}-config.yaml"  # JSON is YAML
        self.auth_token = f"sk-bench-{secrets.token_hex(24)}"
        config.write_text(json.dumps(
            litellm_config(ctx.scenario.backends.model, list(ctx.backend_urls), self.auth_token),
            indent=2,
        ))  # fmt: skip
        port = free_port()
        argv = [str(BINARY), "--config", str(config), "--host", "127.0.0.1",
                "--port", str(port), "--num_workers", "1"]  # fmt: skip
        env = {**ENV, "HOME": str(ctx.work_dir)}
        child = spawn(self.name, pinned(argv, ctx.router_cpus), port=port,
                      log_dir=ctx.work_dir, env=env, cwd=ctx.work_dir)  # fmt: skip
        self.children.append(child)
        timeout = max(ctx.start_timeout_s, 120.0)  # it imports a lot
        await wait_http(child, ctx.session, "/health/liveliness", timeout_s=timeout)
        await warm_up(ctx.session, child.base_url, model=ctx.scenario.backends.model,
                      headers={"Authorization": f"Bearer {self.auth_token}"}, count=3,
                      timeout_s=timeout, child=child)  # fmt: skip
        self.base_urls = [child.base_url]
        self.info = {
            "kind": "LiteLLM proxy (PyPI), simple-shuffle, no database",
            "venv": str(BINARY.parent.parent),
            "cpus": list(ctx.router_cpus),
        }
