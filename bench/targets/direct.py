"""``direct``: no router at all; the load generator round-robins over the backends itself.

The floor every router is compared with: what a router adds is its figure minus this one.
"""

from __future__ import annotations

from dataclasses import dataclass

from bench.targets.base import Target, TargetContext


@dataclass
class DirectTarget(Target):
    async def start(self, ctx: TargetContext) -> None:
        self.base_urls = list(ctx.backend_urls)
        self.info = {"kind": "direct", "balancing": "client-side round robin"}
