"""Loading LoRA adapters into one running vLLM engine, verified, LRU-managed, single-flight.

:class:`AdapterLoader` is a replica's adapter manager: :meth:`AdapterLoader.ensure` makes an
adapter resident before a request uses it. It verifies the adapter folder against the
registry's digest (and signature, :mod:`runtime.signing`) before the engine sees it, asks
:class:`~runtime.workers.adapters.AdapterSlots` what to do (hit, load, evict then load, or all
slots pinned), unloads an evicted adapter (``/v1/unload_lora_adapter``) and loads the new one
(``/v1/load_lora_adapter``, which needs the engine started with ``--enable-lora`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, :mod:`runtime.workers.launch`). Concurrent first
requests for one adapter share one load; a failed load is remembered for a cool-down.
Counters (loads, evictions, hits, the last load's latency) are what a heartbeat reports.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from runtime.artifacts import ArtifactError, verify_artifact
from runtime.routing.adapters import LoadFailedError, SingleFlight
from runtime.signing import SignatureCheck, SignatureError, check_signature
from runtime.workers.adapters import AdapterSlots, Load, Pinned

__all__ = ["AdapterArtifact", "AdapterLoader", "AllSlotsPinnedError", "LoadFailedError"]


@dataclass(frozen=True, kw_only=True)
class AdapterArtifact:
    """An adapter version as the registry describes it (name: ``runtime.snapshot.adapter_name``)."""

    name: str
    path: Path
    digest: str
    files: Mapping[str, str] | None = None
    signature: SignatureCheck | None = None


class AllSlotsPinnedError(Exception):
    """Every slot holds an adapter younger than the minimum residency (answer 429)."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"all adapter slots are pinned for {retry_after_s:.1f} s")
        self.retry_after_s = retry_after_s


@dataclass
class AdapterStats:
    loads: int = 0
    evictions: int = 0
    hits: int = 0
    waited: int = 0  # requests that waited for another request's load
    last_load_s: float = 0.0


class AdapterLoader:
    """One engine's resident adapters (see the module doc)."""

    def __init__(
        self, base_url: str, session: aiohttp.ClientSession, slots: AdapterSlots,
        *, cooldown_s: float = 10.0,
    ) -> None:  # fmt: skip
        self.base_url = base_url.rstrip("/")
        self.slots = slots
        self.stats = AdapterStats()
        self._session = session
        self._flights = SingleFlight(cooldown_s=cooldown_s)
        self._lock = asyncio.Lock()  # slot bookkeeping + engine calls, one change at a time

    async def ensure(self, adapter: AdapterArtifact) -> bool:
        """Make ``adapter`` resident; True when this call loaded it. Raises
        :class:`AllSlotsPinnedError` (429) or :class:`LoadFailedError` (503, with the reason)."""
        if adapter.name in self.slots:
            self.slots.touch(adapter.name)
            self.stats.hits += 1
            return False
        ran = await self._flights.run(
            adapter.name, lambda: self._load(adapter), passthrough=(AllSlotsPinnedError,)
        )
        if not ran:
            self.stats.waited += 1
        return ran

    async def _load(self, adapter: AdapterArtifact) -> None:
        try:
            await asyncio.to_thread(_verify, adapter)
        except (ArtifactError, SignatureError) as exc:
            raise LoadFailedError(f"adapter {adapter.name} refused: {exc}", 0.0) from exc
        async with self._lock:
            decision = self.slots.decide(adapter.name, now=time.monotonic())
            if isinstance(decision, Pinned):
                raise AllSlotsPinnedError(decision.retry_after_s)
            if not isinstance(decision, Load):
                return  # became resident meanwhile
            if decision.evict is not None:
                await self._post("/v1/unload_lora_adapter", {"lora_name": decision.evict})
                self.slots.unloaded(decision.evict)
                self.stats.evictions += 1
            started = time.monotonic()
            body = {"lora_name": adapter.name, "lora_path": str(adapter.path)}
            await self._post("/v1/load_lora_adapter", body)
            self.stats.last_load_s = time.monotonic() - started
            self.stats.loads += 1
            self.slots.loaded(adapter.name, now=time.monotonic())

    async def _post(self, path: str, body: dict[str, str]) -> None:
        async with self._session.post(f"{self.base_url}{path}", json=body) as response:
            if response.status >= 400:
                text = (await response.text())[:300]
                raise RuntimeError(f"{path} answered {response.status}: {text}")


def _verify(adapter: AdapterArtifact) -> None:
    verify_artifact(adapter.path, adapter.digest, adapter.files)
    if adapter.signature is not None:
        check_signature(adapter.signature, adapter.digest)
