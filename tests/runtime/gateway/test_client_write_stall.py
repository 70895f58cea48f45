"""A client that stops reading its stream is dropped after ``client_write_stall_s``.

Without the bound, a stream whose client keeps the connection open but reads nothing holds
its request, its tenant's concurrency slot and its upstream stream until the deadline
(minutes). Here a real router streams a long completion to a raw socket with a small receive
buffer that reads only the head; the tenant's cap is one request, so a second request is
refused 429 while the first is held, and answered once the router has dropped the stalled one.
"""

from __future__ import annotations

import json
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fixtures.router import Process, Publisher, World, limits, start_router, wait_ready
from fixtures.wait import eventually
from gateway_fleet import start_simulator

pytestmark = pytest.mark.integration

MODEL = "stall-chat"
STALL_S = 0.5


@pytest.fixture(scope="module")
def engine() -> Iterator[Process]:
    sim = start_simulator(MODEL, "--decode-a-ms", "0.05", "--decode-b-ms", "0",
                          "--max-model-len", "40000", "--kv-capacity-tokens", "200000")  # fmt: skip
    yield sim
    sim.stop()


def stalled_stream(router: Process, secret: str) -> socket.socket:
    """A streamed chat completion of 30,000 tokens whose client reads its head, then nothing."""
    body = json.dumps({"model": MODEL, "stream": True, "max_tokens": 30000,
                       "messages": [{"role": "user", "content": "hi"}]}).encode()  # fmt: skip
    host, port = router.base_url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connect: a small window
    sock.settimeout(10)
    sock.connect((host, int(port)))
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: router\r\n"
        b"Authorization: Bearer " + secret.encode() + b"\r\nContent-Type: application/json\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
    )
    head = sock.recv(1024)
    assert head.startswith(b"HTTP/1.1 200"), head
    return sock


def dropped(sock: socket.socket) -> bool:
    """Whether the router has dropped the connection (read what is buffered, then EOF or RST)."""
    sock.settimeout(0.2)
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True  # EOF


def test_a_client_that_stops_reading_is_dropped_and_its_slot_freed(
    engine: Process, tmp_path: Path
) -> None:
    world = World()
    world.add_model(MODEL, 1)
    world.add_endpoint(1, 1, engine.base_url, pool="stall", capacity=8)
    world.add_tenant("one", tenant_limits=limits(max_concurrency=1, max_output=40000,
                                                  max_context=40000))  # fmt: skip
    world.add_key("one", "one")
    publisher = Publisher(f"switchyard:test:gw-stall:{uuid.uuid4().hex[:8]}")
    router = start_router(publisher.prefix, tmp_path,
                          SWITCHYARD_CLIENT_WRITE_STALL_S=str(STALL_S))  # fmt: skip
    headers = {"Authorization": f"Bearer {world.secrets['one']}"}
    small = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}
    try:
        wait_ready(router, publisher.publish(world.snapshot()))
        sock = stalled_stream(router, world.secrets["one"])
        try:
            # Held: the tenant's one slot is the stalled stream's.
            refused = httpx.post(f"{router.base_url}/v1/chat/completions", json=small,
                                 headers=headers, timeout=10)  # fmt: skip
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "concurrency_limit_exceeded"
            # The buffers fill in well under a second, then the bound: the slot comes back
            # (the stalled socket is not read meanwhile: reading it would un-stall it).
            eventually(
                lambda: httpx.post(f"{router.base_url}/v1/chat/completions", json=small,
                                   headers=headers, timeout=10).status_code == 200,
                timeout=15, interval=0.1, what="the tenant's slot back",
            )  # fmt: skip
            eventually(lambda: dropped(sock), timeout=10, interval=0.05,
                       what="the stalled connection dropped by the router")  # fmt: skip
        finally:
            sock.close()
        assert "connection dropped" in router.log.read_text()
    finally:
        router.stop()
        publisher.cleanup()
