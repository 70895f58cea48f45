"""The router's two HTTP entries (issue #27, must-have 3): the pure ASGI routes (the default)
and the Channels consumers (``SWITCHYARD_ROUTER_HTTP=channels``, kept for the A/B) route every
path to the same consumer and answer the same requests alike, over a real router in this
process; the pure entry imports neither Django nor Channels; a bad flavour is refused by name.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from gateway_fleet import CHAT_MODEL, Fleet, Publisher, free_port, inprocess_router, redis_url
from gateway_fleet import standard_world as make_world

from runtime.gateway.batch_proxy import BatchApiConsumer
from runtime.gateway.config import ConfigError, RouterConfig
from runtime.gateway.consumers import GatewayConsumer
from runtime.gateway.inference import ChatCompletionsConsumer, EmbeddingsConsumer
from runtime.gateway.routes import resolve, route_table
from runtime.gateway.service import MetricsConsumer, ModelsConsumer, NotFoundConsumer

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[3]

ROUTES: list[tuple[str, type[GatewayConsumer], dict[str, str] | None]] = [
    ("/v1/chat/completions", ChatCompletionsConsumer, None),
    ("/v1/embeddings", EmbeddingsConsumer, None),
    ("/metrics", MetricsConsumer, None),
    ("/v1/models", ModelsConsumer, None),
    ("/v1/models/org/model-7b", ModelsConsumer, {"model": "org/model-7b"}),
    ("/v1/models/", NotFoundConsumer, {}),
    ("/v1/files", BatchApiConsumer, {}),
    ("/v1/batches/b-1/cancel", BatchApiConsumer, {}),
    ("/v1/filesystem", NotFoundConsumer, {}),
    ("/v1/chat/completions/", NotFoundConsumer, {}),
    ("/", NotFoundConsumer, {}),
]


@pytest.mark.parametrize(("path", "consumer", "kwargs"), ROUTES)
def test_each_path_resolves_to_its_consumer(
    path: str, consumer: type[GatewayConsumer], kwargs: dict[str, str] | None
) -> None:
    assert resolve(route_table(), path) == (consumer, kwargs)


def test_the_flavour_is_read_from_the_environment_and_checked() -> None:
    assert RouterConfig.from_env({}).router_http == "asgi"
    assert RouterConfig.from_env({"SWITCHYARD_ROUTER_HTTP": "Channels"}).router_http == "channels"
    with pytest.raises(ConfigError, match="SWITCHYARD_ROUTER_HTTP must be one of asgi, channels"):
        RouterConfig.from_env({"SWITCHYARD_ROUTER_HTTP": "starlette"})


def test_the_pure_entry_imports_neither_django_nor_channels(tmp_path: Path) -> None:
    """In a fresh interpreter: build the app and the whole router state, then look."""
    code = (
        "import sys\n"
        "from runtime.gateway.app import create_app\n"
        "from runtime.gateway.config import RouterConfig\n"
        "from pathlib import Path\n"
        "from runtime.gateway.state import build_state\n"
        f"config = RouterConfig(snapshot_cache_path=Path({str(tmp_path / 's.json')!r}))\n"
        "create_app(config); build_state(config)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'django', 'channels'}))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@contextlib.asynccontextmanager
async def flavoured_router(
    fleet: Fleet, tmp_path: Path, flavour: str
) -> AsyncIterator[tuple[str, str]]:
    publisher = Publisher(f"switchyard:test:http-{flavour}:{uuid.uuid4().hex[:8]}")
    world = make_world(fleet.sims, free_port())
    publisher.publish(world.snapshot())
    config = RouterConfig(
        redis_url=redis_url(), snapshot_prefix=publisher.prefix,
        snapshot_cache_path=tmp_path / flavour / "router-snapshot.json",
        key_usage_hash=f"{publisher.prefix}:apikey:last_used", max_body_bytes=4096,
        router_http=flavour,
    )  # fmt: skip
    try:
        async with inprocess_router(config) as base_url:
            yield base_url, world.secrets["good"]
    finally:
        publisher.cleanup()


async def transcript(base_url: str, key: str) -> list[tuple[str, int, object]]:
    """What a client sees from the same requests: status and body (JSON documents without
    their ids and times; a stream's event count)."""
    auth = {"authorization": f"Bearer {key}"}
    chat = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    seen: list[tuple[str, int, object]] = []
    async with httpx.AsyncClient(base_url=base_url, timeout=20) as http:
        calls = [
            ("GET", "/healthz", {}, None),
            ("GET", "/nowhere", {}, None),
            ("PUT", "/v1/chat/completions", auth, None),
            ("GET", f"/v1/models/{CHAT_MODEL}", auth, None),
            ("GET", "/v1/models/no-such-model", auth, None),
            ("POST", "/v1/chat/completions", {}, chat),
            ("POST", "/v1/chat/completions", auth, {**chat, "messages": "x" * 5000}),
            ("POST", "/v1/chat/completions", auth, chat),
            ("POST", "/v1/chat/completions", auth, {**chat, "stream": True}),
            ("GET", "/v1/batches", auth, None),
        ]
        for method, path, headers, body in calls:
            answer = await http.request(method, path, headers=headers, json=body)
            seen.append((f"{method} {path}", answer.status_code, _shape(answer)))
    return seen


def _shape(answer: httpx.Response) -> object:
    if answer.headers.get("content-type", "").startswith("text/event-stream"):
        return sum(1 for line in answer.text.splitlines() if line.startswith("data: "))
    document = json.loads(answer.text)
    for volatile in ("id", "created", "system_fingerprint", "usage", "choices"):
        if isinstance(document, dict) and volatile in document:
            document[volatile] = "…"
    return document


@pytest.mark.asyncio
async def test_both_flavours_answer_the_same_requests_alike(fleet: Fleet, tmp_path: Path) -> None:
    seen: dict[str, list[tuple[str, int, object]]] = {}
    for flavour in ("asgi", "channels"):
        async with flavoured_router(fleet, tmp_path, flavour) as (base_url, key):
            seen[flavour] = await transcript(base_url, key)
    statuses = [(call, status) for call, status, _ in seen["asgi"]]
    assert statuses == [
        ("GET /healthz", 200),
        ("GET /nowhere", 404),
        ("PUT /v1/chat/completions", 405),
        (f"GET /v1/models/{CHAT_MODEL}", 200),
        ("GET /v1/models/no-such-model", 404),
        ("POST /v1/chat/completions", 401),
        ("POST /v1/chat/completions", 413),
        ("POST /v1/chat/completions", 200),
        ("POST /v1/chat/completions", 200),
        ("GET /v1/batches", 503),
    ]
    assert seen["asgi"] == seen["channels"]
