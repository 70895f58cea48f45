"""The non-inference routes: GET /v1/models, /healthz, /readyz, /metrics, and 404s."""

from __future__ import annotations

import time
from typing import ClassVar

from runtime.gateway.auth import authenticate, bearer_token
from runtime.gateway.consumers import GatewayConsumer, Scope, header
from runtime.gateway.errors import NO_SNAPSHOT, ApiError, as_json
from runtime.snapshot import Snapshot


class ModelsConsumer(GatewayConsumer):
    """The models the key's tenant may use (all published models when it has no list), then
    the model aliases with a member it may use."""

    async def respond(self, body: bytes) -> None:
        snapshot = self.state.snapshot
        if snapshot is None:
            raise ApiError.of("not_ready", reason=NO_SNAPSHOT)
        principal = authenticate(
            snapshot, bearer_token(header(self.scope, b"authorization")), now=time.time()
        )
        self.state.key_usage.record(principal.key.prefix, time.time())
        allowed = principal.tenant.models
        names = sorted(n for n in snapshot.models if not allowed or n in allowed)
        names += sorted(  # a model alias, where the tenant may use one of its members
            a.name for a in snapshot.aliases.values()
            if not allowed or any(m in allowed for m in a.members)
        )  # fmt: skip
        wanted = self.scope.get("url_route", {}).get("kwargs", {}).get("model")
        created = int(snapshot.created_at)
        entries = [model_entry(snapshot, name, created) for name in names]
        if wanted is None:
            await self.send_json(200, as_json({"object": "list", "data": entries}))
            return
        for entry in entries:
            if entry["id"] == wanted:
                await self.send_json(200, as_json(entry))
                return
        raise ApiError.of("model_not_found", param="model", model=wanted)


def model_entry(snapshot: Snapshot, name: str, created: int) -> dict[str, object]:
    """One ``/v1/models`` entry; a LoRA adapter names its base model as ``parent``, as vLLM
    lists its adapters."""
    entry: dict[str, object] = {
        "id": name, "object": "model", "created": created, "owned_by": "switchyard",
    }  # fmt: skip
    model = snapshot.models.get(name)
    if model is not None and model.versions:
        base_id = snapshot.versions[model.versions[-1]].base_version
        base = snapshot.versions.get(base_id) if base_id is not None else None
        if base is not None:
            entry["parent"] = base.model
    return entry


class HealthzConsumer(GatewayConsumer):
    """Liveness: the process answers."""

    async def respond(self, body: bytes) -> None:
        await self.send_json(200, b'{"status":"ok"}')


class ReadyzConsumer(GatewayConsumer):
    """Readiness: only with a snapshot loaded. A stale snapshot is reported, not refused:
    every router would be equally stale, and serving from it beats serving nothing."""

    async def respond(self, body: bytes) -> None:
        snapshot = self.state.snapshot
        if snapshot is None:
            await self.send_json(503, b'{"status":"not ready","reason":"no snapshot loaded"}')
            return
        await self.send_json(
            200,
            as_json(
                {
                    "status": "ready",
                    "snapshot_version": snapshot.version,
                    "snapshot_source": self.state.loader.source,
                    "snapshot_age_s": round(self.state.loader.age_s() or 0.0, 3),
                    "snapshot_stale": self.state.loader.stale,
                }
            ),
        )


class MetricsConsumer(GatewayConsumer):
    """Prometheus exposition of this process's registry."""

    async def respond(self, body: bytes) -> None:
        payload, content_type = self.state.metrics.render()
        await self.start_response(200, [(b"content-type", content_type.encode("latin-1"))])
        await self.send_chunk(payload, last=True)


class NotFoundConsumer(GatewayConsumer):
    methods: ClassVar[tuple[str, ...]] = ("GET", "POST", "PUT", "PATCH", "DELETE", "HEAD")

    def early_error(self, scope: Scope) -> ApiError | None:
        return ApiError.of("unknown_url", path=scope.get("path", ""))

    async def respond(self, body: bytes) -> None:  # pragma: no cover - early_error answers
        raise ApiError.of("unknown_url", path=self.scope.get("path", ""))
