"""Beat without a single point: two real ``celery beat`` processes on a real Redis, exactly one
sends the schedule; kill -9 of that one and the other sends within the lease (+ its poll); a
beat stopped cleanly gives the lease back, so a standby takes over within its poll.

Which beat sent a task is read off the broker: each message's ``origin`` header names the
sending process (``gen<pid>@host``). Measured: the takeover times (printed).
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fixtures.celery_worker import Beat
from fixtures.redis_server import private_redis
from fixtures.wait import eventually

from config import beat_lock
from runtime import contract

pytestmark = [pytest.mark.integration, pytest.mark.timing]

LEASE_S = 3.0
# the bound the module states: lease + standby poll; plus a margin for the loaded 2-core box
KILL_BOUND_S = LEASE_S + beat_lock.STANDBY_POLL_S + 2.0
CLEAN_BOUND_S = beat_lock.STANDBY_POLL_S + 2.0
ORIGIN = re.compile(r"gen(\d+)@")


class Broker:
    """Reads (and drains) the tasks beat sent to the default queue, by sending pid."""

    def __init__(self, client: redis.Redis[bytes]) -> None:
        self.client = client

    def senders(self) -> list[int]:
        pids = []
        while (raw := self.client.rpop("celery")) is not None:
            headers = json.loads(raw)["headers"]
            assert headers["task"] == "apps.billing.tasks.usage_consume"
            found = ORIGIN.match(headers["origin"])
            assert found, headers["origin"]
            pids.append(int(found.group(1)))
        return pids

    def holder_pid(self, namespace: str) -> int | None:
        raw = self.client.get(beat_lock.heartbeat_key(namespace))
        if raw is None:
            return None
        return int(raw.decode().split(" ", 1)[1].split(":")[1])


@pytest.fixture
def world(tmp_path: Path) -> Iterator[tuple[Broker, dict[str, str], str]]:
    namespace = f"switchyard:test:beat:{uuid.uuid4().hex[:10]}"
    with private_redis(tmp_path) as server:
        env = {
            **os.environ,
            "REDIS_URL": server.url,
            "CELERY_BROKER_URL": server.url,
            "CELERY_RESULT_BACKEND": server.url,
            contract.ENV_SNAPSHOT_PREFIX: f"{namespace}:snapshot",
            "SWITCHYARD_BEAT_ONLY": "usage-stream-to-ledger",  # every second
            beat_lock.ENV_LEASE_S: str(LEASE_S),
        }
        client: redis.Redis[bytes] = redis.Redis.from_url(server.url)
        try:
            yield Broker(client), env, namespace
        finally:
            client.close()


def _only_one_sends(broker: Broker, holder: Beat, other: Beat, window_s: float) -> None:
    broker.senders()
    deadline = time.monotonic() + window_s
    seen: list[int] = []
    while time.monotonic() < deadline:
        seen += broker.senders()
        time.sleep(0.2)
    assert other.proc.pid not in seen, f"the standby sent too: {seen}"
    assert seen.count(holder.proc.pid) >= window_s - 2, seen  # every second


def _takes_over(broker: Broker, standby: Beat, namespace: str, bound_s: float) -> float:
    started = time.monotonic()
    eventually(
        lambda: standby.proc.pid in broker.senders(),
        timeout=bound_s,
        interval=0.05,
        what=f"the standby beat (pid {standby.proc.pid}) sending",
    )
    took = time.monotonic() - started
    assert broker.holder_pid(namespace) == standby.proc.pid
    return took


def test_one_beat_schedules_and_the_other_takes_over(
    world: tuple[Broker, dict[str, str], str], tmp_path: Path
) -> None:
    broker, env, namespace = world
    beats = [Beat(env, tmp_path / name) for name in ("a", "b")]
    try:
        holder_pid = eventually(
            lambda: broker.holder_pid(namespace),
            timeout=60.0,
            interval=0.1,
            what="a beat holding the lease",
        )
        holder = next(b for b in beats if b.proc.pid == holder_pid)
        standby = next(b for b in beats if b is not holder)
        eventually(lambda: "standing by" in standby.output(), timeout=60.0, what="the standby")
        _only_one_sends(broker, holder, standby, window_s=4.0)

        holder.proc.send_signal(signal.SIGKILL)
        holder.proc.wait(timeout=10)
        after_kill = _takes_over(broker, standby, namespace, KILL_BOUND_S)
        assert after_kill <= KILL_BOUND_S

        third = Beat(env, tmp_path / "c")
        beats.append(third)
        eventually(lambda: "standing by" in third.output(), timeout=60.0, what="a new standby")
        _only_one_sends(broker, standby, third, window_s=3.0)
        standby.proc.send_signal(signal.SIGTERM)
        after_stop = _takes_over(broker, third, namespace, CLEAN_BOUND_S)
        print(
            f"beat takeover: {after_kill:.2f} s after kill -9 (lease {LEASE_S} s, bound "
            f"{KILL_BOUND_S} s), {after_stop:.2f} s after a clean stop (bound {CLEAN_BOUND_S} s)"
        )
    finally:
        for beat in beats:
            if beat.proc.poll() is not None:
                print(beat.output()[-3000:])
            beat.stop()
