"""Degradation and model aliases through a real router and simulators, with the unmodified
``openai`` client: an alias resolves to its cheapest fitting member (or is a 400), a
saturated pool's interactive request falls back to the smaller model and its batch request
is capped, and a model whose breaker is open falls back."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import openai
import pytest
from fixtures.wait import eventually
from gateway_fleet import (
    Process,
    Publisher,
    World,
    http_get,
    start_router,
    start_simulator,
    wait_ready,
)

from runtime.contract import credit_key

pytestmark = pytest.mark.integration

BIG, SMALL, FLAKY, ALIAS = "deg-big", "deg-small", "deg-flaky", "deg-family"
HI = [{"role": "user", "content": "hi"}]
TOOLS: Any = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


class Fleet:
    def __init__(self, router: Process, sims: list[Process], key: str, pub: Publisher) -> None:
        self.router, self.sims, self.key, self.publisher = router, sims, key, pub

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.router.base_url}/v1", api_key=self.key, max_retries=0, timeout=30
        )

    def metrics(self) -> str:
        return http_get(f"{self.router.base_url}/metrics")[1].decode()

    def sample(self, name: str, **labels: str) -> float:
        """The value of ``name`` with (at least) ``labels``, 0 when absent."""
        for line in self.metrics().splitlines():
            head, _, value = line.rpartition(" ")
            if head.split("{", 1)[0] != name:
                continue
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                return float(value)
        return 0.0


class Failing(BaseHTTPRequestHandler):
    """An engine whose health checks pass and whose every completion is a 500: its breaker
    opens while it looks healthy."""

    def do_GET(self) -> None:
        self._answer(200, b"")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self._answer(500, b'{"error": {"message": "engine fault"}}')

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def world(big: Process, small: Process, failing: str) -> World:
    built = World()
    built.add_class("interactive", band=0, deadline_ms=30_000)
    built.add_class("batch", band=2, deadline_ms=60_000)
    built.add_tenant("acme", classes=("interactive", "batch"), default_class="interactive")
    built.add_key("good", "acme")
    built.add_model(BIG, 1, fallback=SMALL, max_context=4096, capabilities=("tools",))
    built.add_model(SMALL, 2, max_context=1024)
    built.add_model(FLAKY, 3, fallback=SMALL)
    degrade = {"degrade": "interactive:fallback,batch:cap_tokens", "degrade_wait_ms": "1",
               "degrade_max_tokens": "5"}  # fmt: skip
    built.add_pool("gpu", hardware_tier="gpu", policies=degrade)
    built.add_pool("flaky", policies={"degrade": "fallback"})
    built.add_endpoint(1, 1, big.base_url, pool="gpu", capacity=1)
    built.add_endpoint(2, 2, small.base_url)
    built.add_endpoint(3, 3, failing, pool="flaky")
    built.add_price(1, input_per_1k=3.0, output_per_1k=6.0, hardware_tier="gpu")
    built.add_price(2, input_per_1k=0.1, output_per_1k=0.2)
    return built.add_alias(ALIAS, (BIG, SMALL))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    publisher = Publisher(f"switchyard:test:degrade:{uuid.uuid4().hex[:12]}")
    started: list[Process] = []
    failing = ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=failing.serve_forever, daemon=True).start()
    try:
        started.append(start_simulator(BIG, "--decode-a-ms", "50"))  # 20 tokens a second
        started.append(start_simulator(SMALL, "--decode-a-ms", "2"))
        built = world(*started, f"http://127.0.0.1:{failing.server_address[1]}")
        version = publisher.publish(built.snapshot())
        limits = f"{publisher.prefix}:limits"  # under the prefix: cleaned up with it
        publisher.client.hset(credit_key(limits, "acme"), "balance", 10**12)  # priced models
        var_dir: Path = tmp_path_factory.mktemp("degrade-var")
        router = start_router(publisher.prefix, var_dir, SWITCHYARD_LIMITS_PREFIX=limits)
        started.append(router)
        wait_ready(router, version)
        yield Fleet(router, started[:2], built.secrets["good"], publisher)
    finally:
        for process in reversed(started):
            process.stop()
        failing.shutdown()
        failing.server_close()
        publisher.cleanup()


def test_an_alias_resolves_to_the_cheapest_model_that_fits(fleet: Fleet) -> None:
    client = fleet.client()
    raw = client.chat.completions.with_raw_response.create(
        model=ALIAS,
        messages=HI,
        max_tokens=3,  # type: ignore[arg-type]
    )
    assert raw.headers["x-switchyard-model"] == SMALL
    assert raw.parse().model == SMALL
    tools = client.chat.completions.with_raw_response.create(
        model=ALIAS,
        messages=HI,
        max_tokens=3,
        tools=TOOLS,  # type: ignore[arg-type]
    )
    assert tools.headers["x-switchyard-model"] == BIG  # only the big one declares tools
    assert tools.parse().model == BIG
    assert ALIAS in {m.id for m in client.models.list()}


def test_an_alias_nothing_fits_is_a_400_with_the_reason(fleet: Fleet) -> None:
    image: Any = [{"role": "user", "content": [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
    ]}]  # fmt: skip
    with pytest.raises(openai.BadRequestError) as caught:
        fleet.client().chat.completions.create(model=ALIAS, messages=image, max_tokens=3)
    error = caught.value
    assert error.status_code == 400
    assert error.code == "model_alias_unfit"
    assert f"{BIG} lacks vision; {SMALL} lacks vision" in error.message


def test_a_saturated_pool_falls_back_for_interactive_and_caps_batch(fleet: Fleet) -> None:
    client = fleet.client()
    # A holds the big model's only slot for ~2 s; B then waits in its queue.
    holder = client.chat.completions.create(
        model=BIG,
        messages=HI,
        max_tokens=40,
        stream=True,  # type: ignore[arg-type]
    )
    next(iter(holder))  # dispatched: the slot is taken
    waiter_done: list[Any] = []
    waiter = threading.Thread(
        target=lambda: waiter_done.append(
            client.chat.completions.create(model=BIG, messages=HI, max_tokens=2)  # type: ignore[arg-type]
        )
    )
    waiter.start()
    try:
        eventually(
            lambda: fleet.sample("switchyard_queue_length", pool="gpu") >= 1,
            timeout=10, what="the second request queued",
        )  # fmt: skip
        moved = client.chat.completions.with_raw_response.create(
            model=BIG,
            messages=HI,
            max_tokens=4,  # type: ignore[arg-type]
        )
        assert moved.headers["x-switchyard-degraded"] == f"fallback={SMALL}"
        assert moved.headers["x-switchyard-model"] == SMALL
        assert moved.parse().model == SMALL
        capped = client.chat.completions.with_raw_response.create(
            model=BIG, messages=HI, max_tokens=50,  # type: ignore[arg-type]
            extra_headers={"X-Switchyard-Class": "batch"},
        )  # fmt: skip
        assert capped.headers["x-switchyard-degraded"] == "max_tokens=5"
        answer = capped.parse()
        assert answer.model == BIG
        assert answer.choices[0].finish_reason == "length"
        assert answer.usage is not None
        assert answer.usage.completion_tokens == 5
    finally:
        for _ in holder:
            pass
        waiter.join(timeout=30)
    assert waiter_done
    assert waiter_done[0].model == BIG  # queued before the wait: served as asked
    degraded = "switchyard_degraded_total"
    assert fleet.sample(degraded, action="fallback", reason="queue_wait") == 1
    assert fleet.sample(degraded, action="cap_tokens", reason="queue_wait") == 1


def test_a_model_whose_breaker_is_open_falls_back(fleet: Fleet) -> None:
    client = fleet.client()

    def moved() -> Any:
        """None while FLAKY's engine answers 500 (its breaker counting), the raw response
        once the breaker is open and the request was moved."""
        try:
            return client.chat.completions.with_raw_response.create(
                model=FLAKY,
                messages=HI,
                max_tokens=4,
                stream=True,  # type: ignore[arg-type]
            )
        except openai.APIStatusError as exc:
            if exc.status_code not in {502, 503}:
                raise
            return None

    raw = eventually(moved, timeout=20, what="the breaker opened and the request moved")
    assert raw.headers["x-switchyard-degraded"] == f"fallback={SMALL}"
    assert raw.headers["x-switchyard-model"] == SMALL
    assert {chunk.model for chunk in raw.parse()} == {SMALL}
    degraded = "switchyard_degraded_total"
    assert fleet.sample(degraded, action="fallback", reason="breaker_open") == 1
