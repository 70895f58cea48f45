"""The beat task that marks gone the endpoints whose worker stopped heartbeating."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings
from django.utils import timezone

from apps.common.models import AuditEvent
from apps.models.models import Endpoint, ModelVersion, Pool
from apps.models.services import endpoint_register, endpoint_set_state
from apps.models.tasks import HEARTBEAT_TTL_S, endpoints_reap_stale
from runtime.workers.heartbeat import endpoint_heartbeat_key

pytestmark = [pytest.mark.db, pytest.mark.integration, pytest.mark.django_db]

Make = Callable[..., Endpoint]


class Heartbeats:
    """Writes endpoints' heartbeat keys as a worker does, and deletes them afterwards."""

    def __init__(self) -> None:
        self.client: redis.Redis[bytes] = redis.Redis.from_url(settings.REDIS_URL)
        self.keys: list[str] = []

    def beat(self, endpoint: Endpoint) -> None:
        key = endpoint_heartbeat_key(endpoint.pk)
        self.client.set(key, '{"state": "ready"}', px=60_000)
        self.keys.append(key)

    def close(self) -> None:
        if self.keys:
            self.client.delete(*self.keys)
        self.client.close()


@pytest.fixture
def heartbeats() -> Iterator[Heartbeats]:
    beats = Heartbeats()
    yield beats
    beats.close()


@pytest.fixture
def make_endpoint(pool: Pool, published: ModelVersion) -> Make:
    counter = iter(range(1, 1000))

    def make(*, state: str = "ready", age_s: float = 3 * HEARTBEAT_TTL_S) -> Endpoint:
        endpoint = endpoint_register(
            actor=None,
            pool=pool,
            version=published,
            base_url=f"http://10.0.0.{next(counter)}:8000",
            capacity=4,
        )
        if state != Endpoint.State.STARTING:
            endpoint_set_state(actor=None, endpoint=endpoint, state=state)
        # Test setup, not a business write: pretend it registered ``age_s`` seconds ago.
        Endpoint.objects.filter(pk=endpoint.pk).update(
            created_at=timezone.now() - dt.timedelta(seconds=age_s)
        )
        endpoint.refresh_from_db()
        return endpoint

    return make


@pytest.mark.parametrize("state", ["starting", "ready", "draining"])
def test_a_live_endpoint_without_heartbeat_is_marked_gone(
    make_endpoint: Make, publishes: Any, state: str
) -> None:
    endpoint = make_endpoint(state=state)
    publishes.reset()

    assert endpoints_reap_stale() == [endpoint.pk]

    endpoint.refresh_from_db()
    assert endpoint.state == Endpoint.State.GONE
    event = AuditEvent.objects.filter(action="endpoint.set_state").order_by("-pk").first()
    assert event is not None
    assert (event.before, event.after) == ({"state": state}, {"state": "gone"})
    assert event.actor is None
    assert publishes.pending  # routers stop sending it traffic after the commit


def test_an_endpoint_with_a_heartbeat_is_left_alone(
    make_endpoint: Make, heartbeats: Heartbeats
) -> None:
    alive = make_endpoint()
    dead = make_endpoint()
    heartbeats.beat(alive)

    assert endpoints_reap_stale() == [dead.pk]

    alive.refresh_from_db()
    dead.refresh_from_db()
    assert (alive.state, dead.state) == ("ready", "gone")


def test_a_just_registered_endpoint_is_not_reaped_before_its_first_beat(
    make_endpoint: Make, publishes: Any
) -> None:
    young = make_endpoint(state="starting", age_s=HEARTBEAT_TTL_S / 3)
    publishes.reset()

    assert endpoints_reap_stale() == []

    young.refresh_from_db()
    assert young.state == Endpoint.State.STARTING
    assert not publishes.pending


def test_gone_endpoints_are_not_touched(make_endpoint: Make) -> None:
    gone = make_endpoint(state="gone")
    before = AuditEvent.objects.count()

    assert endpoints_reap_stale() == []
    assert AuditEvent.objects.count() == before
    gone.refresh_from_db()
    assert gone.state == Endpoint.State.GONE


def test_nothing_is_reaped_while_redis_cannot_be_read(
    make_endpoint: Make, settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    endpoint = make_endpoint()
    settings.REDIS_URL = "redis://127.0.0.1:1/0"  # nothing listens there

    assert endpoints_reap_stale() == []

    endpoint.refresh_from_db()
    assert endpoint.state == Endpoint.State.READY
    assert "cannot read endpoint heartbeats" in caplog.text


def test_no_live_endpoint_needs_no_redis(db: Any, settings: Any) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    assert endpoints_reap_stale() == []


def test_beat_runs_it_every_15_seconds() -> None:
    entries = [
        entry
        for entry in settings.CELERY_BEAT_SCHEDULE.values()
        if entry["task"] == "apps.models.tasks.endpoints_reap_stale"
    ]
    assert entries == [{"task": "apps.models.tasks.endpoints_reap_stale", "schedule": 15.0}]
    assert endpoints_reap_stale.name == "apps.models.tasks.endpoints_reap_stale"
