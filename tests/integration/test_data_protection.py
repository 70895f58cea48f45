"""Data protection through a real router process and a simulator engine (issue #31): what the
cache keeps in Redis is sealed (no prompt or answer bytes in any key of the deployment), replays
with the unmodified ``openai`` client, still replays after a key rotation and reads as a miss
once its key left the ring; a ``zero_retention`` tenant is never cached nor recorded, and only
its usage metadata is kept.

Upstream requests are counted at the simulator's ``/metrics``, usage in the router's stream.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import msgspec
import openai
import pytest
from fixtures.router import Process, Publisher, World, start_router, wait_ready
from fixtures.wait import eventually

from runtime.contract import namespace_of
from runtime.crypto import SHARED_SCOPE, Keyring, generate_key, is_sealed, tenant_scope
from runtime.metering.events import decode_event
from runtime.snapshot import CachePolicySnap
from tests.integration.test_cache import start_simulator, upstream_count

pytestmark = pytest.mark.integration

MODEL, SHARED = "dp-chat", "dp-shared"
K1, K2 = f"k1:{generate_key()}", f"k2:{generate_key()}"


@dataclass
class Stage:
    sim: Process
    shared_sim: Process
    world: World
    publisher: Publisher
    version: int
    tmp: pytest.TempPathFactory

    @property
    def namespace(self) -> str:
        return namespace_of(self.publisher.prefix)

    def router(self, keys: str) -> Process:
        router = start_router(self.publisher.prefix, self.tmp.mktemp("dp-router"),
                              SWITCHYARD_AT_REST_KEYS=keys)  # fmt: skip
        wait_ready(router, self.version)
        return router

    def client(self, router: Process, key: str = "a") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{router.base_url}/v1", api_key=self.world.secrets[key],
                             max_retries=0, timeout=30)  # fmt: skip

    def stored(self) -> dict[bytes, bytes]:
        """Every value under the deployment's namespace, as bytes, whatever its type."""
        client, found = self.publisher.client, {}
        for key in client.scan_iter(match=f"{self.namespace}:*"):
            kind = client.type(key)
            if kind == b"string":
                found[key] = client.get(key) or b""
            elif kind == b"hash":
                found[key] = repr(client.hgetall(key)).encode()
            elif kind == b"stream":
                found[key] = repr(client.xrange(key)).encode()
            elif kind == b"zset":
                found[key] = repr(client.zrange(key, 0, -1)).encode()
            elif kind in (b"list", b"set"):
                items = client.lrange(key, 0, -1) if kind == b"list" else client.smembers(key)
                found[key] = repr(items).encode()
        return found

    def usage_events(self, request_ids: set[str]) -> list[object]:
        client = self.publisher.client
        events = [decode_event(f[b"event"])
                  for _, f in client.xrange(f"{self.publisher.prefix}:usage")]  # fmt: skip
        return [e for e in events if e.request_id in request_ids]  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def stage(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stage]:
    sim = start_simulator(MODEL, "--decode-a-ms", "1")
    shared_sim = start_simulator(SHARED, "--decode-a-ms", "1")
    publisher = Publisher(f"switchyard:test:dp:{uuid.uuid4().hex[:12]}")
    try:
        world = World()
        world.add_class("interactive", band=0, deadline_ms=30_000)
        for slug in ("acme", "beta"):
            world.add_tenant(slug, classes=("interactive",), default_class="interactive")
        world.add_tenant("zero", classes=("interactive",), default_class="interactive",
                         zero_retention=True)  # fmt: skip
        world.add_key("a", "acme")
        world.add_key("b", "beta")
        world.add_key("z", "zero")
        world.add_model(MODEL, 1, digest="sha256:" + "1" * 64)
        world.add_model(SHARED, 2, digest="sha256:" + "2" * 64)
        world.models[SHARED] = msgspec.structs.replace(
            world.models[SHARED], cache=CachePolicySnap(shared=True))  # fmt: skip
        world.add_endpoint(1, 1, sim.base_url)
        world.add_endpoint(2, 2, shared_sim.base_url)
        version = publisher.publish(world.snapshot())
        yield Stage(sim, shared_sim, world, publisher, version, tmp_path_factory)
    finally:
        sim.stop()
        shared_sim.stop()
        publisher.cleanup()


def marked(marker: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": f"my account password is {marker}, keep it"}]


def stream_text(client: openai.OpenAI, model: str, marker: str) -> tuple[str, str]:
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=marked(marker), temperature=0, max_tokens=12, stream=True,
    )  # type: ignore[arg-type]  # fmt: skip
    text = "".join(c.choices[0].delta.content or "" for c in raw.parse() if c.choices)
    return raw.headers.get("x-switchyard-cache", ""), text


def assert_nothing_readable(stage: Stage, *secrets: str) -> dict[bytes, bytes]:
    stored = stage.stored()
    for key, value in stored.items():
        for secret in secrets:
            assert secret.encode() not in value, (key, secret)
    return stored


def test_entries_are_sealed_replay_and_survive_a_rotation(stage: Stage) -> None:
    marker, answer_of = f"MARK-{uuid.uuid4().hex}", {}
    first = stage.router(K1)
    try:
        client = stage.client(first)
        before = upstream_count(stage.sim)
        miss = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=marked(marker), temperature=0, max_tokens=12)  # fmt: skip
        hit = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=marked(marker), temperature=0, max_tokens=12)  # fmt: skip
        assert (miss.headers["x-switchyard-cache"], hit.headers["x-switchyard-cache"]) \
            == ("miss", "hit")  # fmt: skip
        assert hit.parse().model_dump() == miss.parse().model_dump()
        answer = miss.parse().choices[0].message.content or ""
        assert len(answer) >= 8
        answer_of[marker] = answer
        assert stream_text(client, MODEL, marker) == ("hit", answer)  # a unary entry streams
        assert upstream_count(stage.sim) == before + 1

        def idempotent() -> httpx.Response:
            return httpx.post(
                f"{first.base_url}/v1/chat/completions",
                json={"model": MODEL, "messages": marked(marker + "-idem"), "max_tokens": 6},
                headers={"Authorization": f"Bearer {stage.world.secrets['a']}",
                         "Idempotency-Key": f"retry-{marker}"}, timeout=30,
            )  # fmt: skip

        idem, again = idempotent(), idempotent()
        assert idem.status_code == 200, idem.text
        assert again.headers["x-switchyard-cache"] == "idempotent-replay"
        assert again.json() == idem.json()

        shared = stage.client(first).chat.completions.create(
            model=SHARED, messages=marked(marker), temperature=0, max_tokens=12)  # fmt: skip
        other = stream_text(stage.client(first, "b"), SHARED, marker)  # another tenant
        assert other == ("hit", shared.choices[0].message.content)  # the shared entry

        stored = assert_nothing_readable(stage, marker, answer, idem.json()["id"])
        ring = Keyring.from_spec(K1)
        cache = {k: v for k, v in stored.items() if b":cache:e:" in k}
        records = {k: v for k, v in stored.items() if b":idem:" in k}
        assert len(cache) == 2 and len(records) == 1  # noqa: PT018
        for key, value in {**cache, **records}.items():
            assert is_sealed(value), key
            scope = SHARED_SCOPE if b":cache:e:*:" in key else tenant_scope("acme")
            ring.open(value, scope, key)  # the tenant's key, or the shared scope's
    finally:
        first.stop()

    rotated = stage.router(f"{K2},{K1}")  # a new primary: old entries still replay
    try:
        before = upstream_count(stage.sim)
        assert stream_text(stage.client(rotated), MODEL, marker) == ("hit", answer)
        newer = f"MARK-{uuid.uuid4().hex}"
        assert stream_text(stage.client(rotated), MODEL, newer)[0] == "miss"
        assert upstream_count(stage.sim) == before + 1
    finally:
        rotated.stop()

    dropped = stage.router(K2)  # k1 left the ring: its entries read as misses, k2's still hit
    try:
        assert stream_text(stage.client(dropped), MODEL, newer)[0] == "hit"
        assert stream_text(stage.client(dropped), MODEL, marker) == ("miss", answer)
        metrics = httpx.get(f"{dropped.base_url}/metrics", timeout=5).text.splitlines()
        unreadable = [float(m.rsplit(" ", 1)[1]) for m in metrics
                      if m.startswith("switchyard_cache_unreadable_total ")]  # fmt: skip
        assert unreadable[0] >= 1  # read once, and again by the single flight's second look
        assert marker not in dropped.output()
        assert answer not in dropped.output()
    finally:
        dropped.stop()


def test_zero_retention_tenant_is_never_cached_nor_recorded(stage: Stage) -> None:
    marker = f"ZERO-{uuid.uuid4().hex}"
    router = stage.router(K1)
    try:
        body = {"model": MODEL, "messages": marked(marker), "temperature": 0, "max_tokens": 8}
        headers = {"Authorization": f"Bearer {stage.world.secrets['z']}"}
        before = upstream_count(stage.sim)
        ids, answers = set(), []
        for extra in ({}, {}, {"Idempotency-Key": marker}, {"Idempotency-Key": marker}):
            response = httpx.post(f"{router.base_url}/v1/chat/completions", json=body,
                                  headers={**headers, **extra}, timeout=30)  # fmt: skip
            assert response.status_code == 200, response.text
            assert "x-switchyard-cache" not in response.headers
            ids.add(response.headers["x-request-id"])
            answers.append(response.json()["choices"][0]["message"]["content"])
        how, streamed = stream_text(stage.client(router, "z"), MODEL, marker)
        assert how == ""  # neither a hit nor a captured miss
        assert upstream_count(stage.sim) == before + 5  # every one reached the engine
        stored = assert_nothing_readable(stage, marker, *answers, streamed)
        assert not [k for k in stored if b":cache:e:zero:" in k or b":idem:zero:" in k]
        eventually(lambda: len(stage.usage_events(ids)) == 4, timeout=10, what="usage events")
        assert {e.tenant for e in stage.usage_events(ids)} == {"zero"}  # type: ignore[attr-defined]
    finally:
        router.stop()
