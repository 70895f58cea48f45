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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import aiohttp

from runtime.artifacts import ArtifactError, verify_artifact
from runtime.routing.adapters import LoadFailedError, SingleFlight
from runtime.signing import SignatureCheck, SignatureError, check_signature
from runtime.snapshot import EndpointSnap, VersionSnap, adapter_name
from runtime.workers.adapters import DEFAULT_MAX_LORAS, AdapterSlots, Load, Pinned

ENGINE_CALL_TIMEOUT = aiohttp.ClientTimeout(total=60)

__all__ = [
    "AdapterArtifact", "AdapterFleet", "AdapterLoader", "AllSlotsPinnedError", "LoadFailedError",
]  # fmt: skip


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
        self, base_url: str, session: aiohttp.ClientSession | None, slots: AdapterSlots,
        *, cooldown_s: float = 10.0, clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        """``session``: None opens one per engine call (loads are rare; nothing to close).
        ``clock``: the residency clock (monotonic seconds; injected by tests)."""
        self.base_url = base_url.rstrip("/")
        self.slots = slots
        self._clock = clock
        self.stats = AdapterStats()
        self._session = session
        self._flights = SingleFlight(cooldown_s=cooldown_s)
        self._lock = asyncio.Lock()  # slot bookkeeping + engine calls, one change at a time

    async def ensure(self, adapter: AdapterArtifact) -> bool:
        """Make ``adapter`` resident; True when this call loaded it. Raises
        :class:`AllSlotsPinnedError` (429) or :class:`LoadFailedError` (503, with the reason)."""
        if self.hit(adapter.name):
            return False
        ran = await self._flights.run(
            adapter.name, lambda: self._load(adapter), passthrough=(AllSlotsPinnedError,)
        )
        if not ran:
            self.stats.waited += 1
        return ran

    def hit(self, name: str) -> bool:
        """True (and counted as a use) when ``name`` is resident."""
        if name not in self.slots:
            return False
        self.slots.touch(name)
        self.stats.hits += 1
        return True

    async def _load(self, adapter: AdapterArtifact) -> None:
        try:
            await asyncio.to_thread(_verify, adapter)
        except (ArtifactError, SignatureError) as exc:
            raise LoadFailedError(f"adapter {adapter.name} refused: {exc}", 0.0) from exc
        async with self._lock:
            decision = self.slots.decide(adapter.name, now=self._clock())
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
            self.slots.loaded(adapter.name, now=self._clock())

    async def _post(self, path: str, body: dict[str, str]) -> None:
        if self._session is None:
            async with aiohttp.ClientSession(timeout=ENGINE_CALL_TIMEOUT) as session:
                await _post(session, f"{self.base_url}{path}", body)
        else:
            await _post(self._session, f"{self.base_url}{path}", body)


async def _post(session: aiohttp.ClientSession, url: str, body: dict[str, str]) -> None:
    async with session.post(url, json=body) as response:
        if response.status >= 400:
            text = (await response.text())[:300]
            raise RuntimeError(f"{url} answered {response.status}: {text}")


def local_path(uri: str) -> Path | None:
    """The folder of a ``file://`` (or plain path) artifact URI; None for a remote one."""
    parsed = urlsplit(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    return Path(uri) if parsed.scheme == "" and uri else None


class AdapterFleet:
    """The router's view of every replica's adapters: one :class:`AdapterLoader` per endpoint
    (``max_loras`` slots each, as the launcher starts engines), made on first use."""

    def __init__(
        self, *, max_loras: int = DEFAULT_MAX_LORAS, min_residency_s: float = 30.0
    ) -> None:
        self.max_loras = max_loras
        self.min_residency_s = min_residency_s
        self._loaders: dict[tuple[int, str], AdapterLoader] = {}

    def loader(self, endpoint: EndpointSnap) -> AdapterLoader:
        key = (endpoint.id, endpoint.base_url)
        loader = self._loaders.get(key)
        if loader is None:
            slots = AdapterSlots(max_loras=self.max_loras, min_residency_s=self.min_residency_s)
            loader = self._loaders[key] = AdapterLoader(endpoint.base_url, None, slots)
        return loader

    def resident(self) -> dict[int, tuple[str, ...]]:
        """Endpoint id -> its resident adapters (LRU first): the fleet view's residency."""
        return {key[0]: loader.slots.resident() for key, loader in self._loaders.items()}

    async def ensure(self, endpoint: EndpointSnap, version: VersionSnap) -> bool:
        """Make adapter ``version`` resident on ``endpoint`` (True: this call loaded it)."""
        name, loader = adapter_name(version), self.loader(endpoint)
        if loader.hit(name):
            return False
        path = local_path(version.artifact_uri)
        if path is None:
            reason = f"its artifact {version.artifact_uri!r} is not a local folder"
            raise LoadFailedError(reason, 60.0)
        artifact = AdapterArtifact(name=name, path=path, digest=version.digest)
        return await loader.ensure(artifact)


def _verify(adapter: AdapterArtifact) -> None:
    verify_artifact(adapter.path, adapter.digest, adapter.files)
    if adapter.signature is not None:
        check_signature(adapter.signature, adapter.digest)
