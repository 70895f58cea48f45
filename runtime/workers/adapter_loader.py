"""Loading LoRA adapters into one running vLLM engine, verified, LRU-managed, single-flight.

:class:`AdapterLoader` is a replica's adapter manager: :meth:`AdapterLoader.ensure` makes an
adapter resident before a request uses it. It verifies the adapter folder against the
registry's digest (and signature, :mod:`runtime.signing`) before the engine sees it, asks
:class:`~runtime.workers.adapters.AdapterSlots` what to do (hit, load, evict then load, or all
slots pinned), unloads an evicted adapter (``/v1/unload_lora_adapter``) and loads the new one
(``/v1/load_lora_adapter``, which needs the engine started with ``--enable-lora`` and
``VLLM_ALLOW_RUNTIME_LORA_UPDATING``, :mod:`runtime.workers.launch`). Concurrent first
requests for one adapter share one load; a failed load is remembered for a cool-down.
Counters (loads, evictions, hits, waits, load latency) are exported on the router's
``/metrics`` (:mod:`runtime.telemetry.adapter_metrics`).

:class:`AdapterFleet` is the router's residency book over every replica
(:class:`runtime.routing.adapters.ResidencyBook`, read by the ``adapter_residency`` scorer at
placement): one loader per endpoint, sized by its pool's :class:`LoraSettings`, and what the
replicas' heartbeats report (:meth:`AdapterFleet.observe`: adapters another router loaded).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import aiohttp

from runtime.artifacts import ArtifactError, verify_artifact
from runtime.routing.adapters import AdapterSignal, LoadFailedError, SingleFlight
from runtime.signing import SignatureCheck, SignatureError, check_signature
from runtime.snapshot import EndpointSnap, SigningSnap, Snapshot, VersionSnap, adapter_name
from runtime.telemetry.adapter_metrics import AdapterRow
from runtime.workers.adapters import (
    DEFAULT_MAX_LORAS,
    DEFAULT_MIN_RESIDENCY_S,
    AdapterSlots,
    Load,
    LoraSettings,
    Pinned,
)

ENGINE_CALL_TIMEOUT = aiohttp.ClientTimeout(total=60)
ALREADY_LOADED = "has already been loaded"  # vLLM's 400 for a load of a resident adapter

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
    load_s_total: float = 0.0  # summed load latency (its mean: load_s_total / loads)

    def mean_load_s(self) -> float:
        return self.load_s_total / self.loads if self.loads else 0.0


class AdapterLoader:
    """One engine's resident adapters (see the module doc)."""

    def __init__(
        self, base_url: str, session: aiohttp.ClientSession | None, slots: AdapterSlots,
        *, cooldown_s: float = 10.0, clock: Callable[[], float] = time.monotonic,
        max_loras: int = DEFAULT_MAX_LORAS, spare: Callable[[], Container[str]] | None = None,
    ) -> None:  # fmt: skip
        """``session``: None opens one per engine call (loads are rare; nothing to close).
        ``clock``: the residency clock (monotonic seconds; injected by tests)."""
        self.base_url = base_url.rstrip("/")
        self.slots = slots
        self._clock = clock
        self.stats = AdapterStats()
        self.max_loras = max_loras  # distinct adapters in one batch of the engine
        self.active: Counter[str] = Counter()  # adapter -> the router's requests in flight
        self._spare = spare  # adapters resident on other replicas too (evicted first)
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

    def loading(self, name: str) -> bool:
        """True while a load of ``name`` is in flight on this engine."""
        return self._flights.running(name)

    def signal(self, name: str) -> AdapterSignal:
        """What placement knows of ``name`` here (no bookkeeping changes)."""
        active = self.active.get(name, 0)
        full = active == 0 and len(self.active) >= self.max_loras
        load_s = self.stats.mean_load_s()
        if name in self.slots or self.loading(name):
            return AdapterSignal(resident=True, load_s=load_s, active=active, batch_full=full)
        pinned = self.slots.pinned_for(now=self._clock()) is not None
        return AdapterSignal(resident=False, load_s=load_s, pinned=pinned, batch_full=full)

    def begin(self, name: str) -> None:
        """A request for ``name`` was sent here (it is in the engine's batch until :meth:`end`)."""
        self.active[name] += 1

    def end(self, name: str) -> None:
        left = self.active.get(name, 0) - 1
        if left > 0:
            self.active[name] = left
        else:
            self.active.pop(name, None)

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
            spare = self._spare() if self._spare is not None else frozenset()
            decision = self.slots.decide(adapter.name, now=self._clock(), spare=spare)
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
            self.stats.load_s_total += self.stats.last_load_s
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
            if response.status == 400 and ALREADY_LOADED in text:
                return  # another router loaded it first (vLLM's answer): resident, as wanted
            raise RuntimeError(f"{url} answered {response.status}: {text}")


async def engine_adapters(base_url: str) -> dict[str, object]:
    """The adapters an engine has loaded, from its ``/v1/models`` (entries with a ``parent``,
    as vLLM lists them): ``{"adapters": [...]}``, the heartbeat's residency field."""
    timeout = aiohttp.ClientTimeout(total=2)
    url = f"{base_url.rstrip('/')}/v1/models"
    async with aiohttp.ClientSession(timeout=timeout) as session, session.get(url) as response:
        response.raise_for_status()
        body = await response.json()
    data = body.get("data") if isinstance(body, dict) else None
    names = sorted(
        str(m["id"]) for m in data or () if isinstance(m, dict) and m.get("parent") and "id" in m
    )
    return {"adapters": names}


def local_path(uri: str) -> Path | None:
    """The folder of a ``file://`` (or plain path) artifact URI; None for a remote one."""
    parsed = urlsplit(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    return Path(uri) if parsed.scheme == "" and uri else None


class AdapterFleet:
    """The router's view of every replica's adapters: one :class:`AdapterLoader` per endpoint,
    made on first use with its pool's :class:`LoraSettings` (``max_cpu_loras`` resident
    slots, as the launcher starts engines)."""

    def __init__(
        self,
        *,
        min_residency_s: float = DEFAULT_MIN_RESIDENCY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.min_residency_s = min_residency_s
        self._clock = clock
        self._loaders: dict[int, AdapterLoader] = {}
        self._urls: dict[int, str] = {}
        self._reported: dict[int, frozenset[str]] = {}  # endpoint -> its heartbeat's adapters
        self._started: dict[int, object] = {}  # endpoint -> its engine's start (heartbeat)
        self._settings: dict[str, tuple[object, LoraSettings]] = {}  # pool -> (policies, settings)

    def settings(self, snapshot: Snapshot | None, pool: str) -> LoraSettings:
        """The pool's adapter slots (the defaults for a bad or missing value: the control
        plane refuses those where they are written, :mod:`runtime.pool_policies`)."""
        found = None if snapshot is None else snapshot.pools.get(pool)
        if found is None:
            return LoraSettings()
        cached = self._settings.get(pool)
        if cached is not None and cached[0] is found.policies:
            return cached[1]
        try:
            settings = LoraSettings.from_policies(found.policies)
        except ValueError:
            settings = LoraSettings()
        self._settings[pool] = (found.policies, settings)
        return settings

    def loader(self, endpoint: EndpointSnap, settings: LoraSettings | None = None) -> AdapterLoader:
        """The endpoint's loader; a new one when its URL changed (a new replica)."""
        loader = self._loaders.get(endpoint.id)
        if loader is None or self._urls.get(endpoint.id) != endpoint.base_url:
            lora = settings or LoraSettings()
            slots = AdapterSlots(capacity=lora.max_cpu_loras, min_residency_s=self.min_residency_s)
            loader = AdapterLoader(
                endpoint.base_url, None, slots, clock=self._clock, max_loras=lora.max_loras,
                spare=lambda: self._elsewhere(endpoint.id),
            )  # fmt: skip
            self._loaders[endpoint.id] = loader
            self._urls[endpoint.id] = endpoint.base_url
            for name in self._reported.get(endpoint.id, ()):
                slots.seen(name, now=self._clock())
        elif settings is not None:
            loader.slots.capacity = settings.max_cpu_loras
            loader.max_loras = settings.max_loras
        return loader

    def _elsewhere(self, endpoint_id: int) -> frozenset[str]:
        """Adapters resident on the fleet's other replicas (an eviction prefers those)."""
        names: set[str] = set()
        for eid, loader in self._loaders.items():
            if eid != endpoint_id:
                names.update(loader.slots.resident())
        for eid, reported in self._reported.items():
            if eid != endpoint_id:
                names.update(reported)
        return frozenset(names)

    def resident(self) -> dict[int, tuple[str, ...]]:
        """Endpoint id -> its resident adapters (LRU first; with those only a heartbeat
        reported, least recently used first): the fleet view's residency."""
        out = {eid: loader.slots.resident() for eid, loader in self._loaders.items()}
        for eid, names in self._reported.items():
            if eid not in out:
                out[eid] = tuple(sorted(names))
        return out

    def rows(self) -> list[AdapterRow]:
        """Each endpoint's counters and residency, for ``/metrics``."""
        resident = self.resident()
        rows = []
        for eid in sorted(resident):
            loader = self._loaders.get(eid)
            stats = loader.stats if loader is not None else AdapterStats()
            rows.append(
                AdapterRow(
                    endpoint=eid, loads=stats.loads, evictions=stats.evictions,
                    waited=stats.waited, hits=stats.hits, load_s_total=stats.load_s_total,
                    resident=len(resident[eid]),
                    active=len(loader.active) if loader is not None else 0,
                )
            )  # fmt: skip
        return rows

    def observe(self, endpoint_id: int, names: frozenset[str], *, started: object = None) -> None:
        """A heartbeat says the replica has ``names`` loaded (another router may have loaded
        some): placement counts them resident; the LRU may evict them like its own.
        ``started`` names the engine's start (the heartbeat's ``started``): when it differs
        from the last one seen, the engine restarted and lost its adapters, so what the router
        knew of it is dropped and ``names`` alone is resident."""
        if started is not None:
            before = self._started.get(endpoint_id)
            self._started[endpoint_id] = started
            if before is not None and before != started:
                self.restarted(endpoint_id)
        self._reported[endpoint_id] = names
        loader = self._loaders.get(endpoint_id)
        if loader is not None:
            for name in names:
                loader.slots.seen(name, now=self._clock())

    def restarted(self, endpoint_id: int) -> None:
        """The replica's engine restarted (same URL, nothing loaded): forget its residency;
        its next request makes a fresh loader (its counters start again)."""
        self._loaders.pop(endpoint_id, None)
        self._urls.pop(endpoint_id, None)
        self._reported.pop(endpoint_id, None)

    def lost(self, endpoint: EndpointSnap, name: str) -> None:
        """The engine says it does not hold ``name`` (its 404) though the router believed
        it resident: not resident there any more."""
        loader = self._loaders.get(endpoint.id)
        if loader is not None:
            loader.slots.unloaded(name)
        reported = self._reported.get(endpoint.id)
        if reported is not None and name in reported:
            self._reported[endpoint.id] = reported - {name}

    def forget(self, keep: frozenset[int]) -> None:
        """Drop what is known of endpoints that left the snapshot."""
        for eid in [e for e in self._loaders if e not in keep]:
            del self._loaders[eid]
            self._urls.pop(eid, None)
        for eid in [e for e in self._reported if e not in keep]:
            del self._reported[eid]
        for eid in [e for e in self._started if e not in keep]:
            del self._started[eid]

    def adapter_signal(self, endpoint_id: int, name: str) -> AdapterSignal:
        loader = self._loaders.get(endpoint_id)
        if loader is not None:
            return loader.signal(name)
        return AdapterSignal(resident=name in self._reported.get(endpoint_id, ()))

    async def ensure(
        self,
        endpoint: EndpointSnap,
        version: VersionSnap,
        *,
        settings: LoraSettings | None = None,
        signing: SigningSnap | None = None,
    ) -> bool:
        """Make adapter ``version`` resident on ``endpoint`` (True: this call loaded it),
        checking its digest, and its signature against ``signing`` (the snapshot's keys and
        mode, as a worker checks a model's) when given."""
        name, loader = adapter_name(version), self.loader(endpoint, settings)
        if loader.hit(name):
            return False
        path = local_path(version.artifact_uri)
        if path is None:
            reason = f"its artifact {version.artifact_uri!r} is not a local folder"
            raise LoadFailedError(reason, 60.0)
        signature = None
        if signing is not None:
            signature = SignatureCheck(
                required=signing.required,
                key_name=version.signing_key,
                signature=version.signature,
                trusted=signing.trusted,
            )
        artifact = AdapterArtifact(name=name, path=path, digest=version.digest, signature=signature)
        return await loader.ensure(artifact)


def _verify(adapter: AdapterArtifact) -> None:
    verify_artifact(adapter.path, adapter.digest, adapter.files)
    if adapter.signature is not None:
        check_signature(adapter.signature, adapter.digest)
