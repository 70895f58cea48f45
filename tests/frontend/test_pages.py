"""The dashboard's pages: login, who sees which page, plotly served locally, rollout buttons
(queued as Celery tasks: eager here, a real worker in tests/browser), the scaling page."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client
from fixtures.router import Process, redis_url

from apps.models.models import Route
from apps.models.services import endpoint_register, endpoint_set_state, pool_create
from apps.rollouts import tasks
from apps.rollouts.models import Rollout
from config.celery import app
from frontend.control_feed import control_document, tasks_key
from tests.apps.rollouts.support import start_simulator

pytestmark = pytest.mark.integration


@pytest.fixture
def eager_celery(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Tasks run in the request, their results stored in the real result backend (Redis)."""
    app.conf.task_always_eager = True
    for name in ("start", "advance", "pause", "resume", "promote", "rollback"):
        # A task reads task_store_eager_result once, when first bound: set it on each task.
        monkeypatch.setattr(getattr(tasks, f"rollout_{name}"), "store_eager_result", True)
    try:
        yield
    finally:
        app.conf.task_always_eager = False


def _client(user: User, *, csrf: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


def test_login_then_staff_land_on_traffic(people: dict[str, User]) -> None:
    client = Client()
    response = client.get("/dashboard/")
    assert response.status_code == 302
    assert response["Location"].startswith("/accounts/login/")
    assert client.get("/accounts/login/").status_code == 200
    response = client.post("/accounts/login/", {"username": "staff", "password": "pw-staff"})
    assert response.status_code == 302
    response = client.get("/dashboard/", follow=True)
    assert response.redirect_chain[-1][0] == "/dashboard/traffic/"
    assert b'id="chart-rate"' in response.content
    assert b"/dashboard/vendor/plotly.min.js" in response.content


def test_wrong_password_is_refused(people: dict[str, User]) -> None:
    response = Client().post("/accounts/login/", {"username": "staff", "password": "nope"})
    assert response.status_code == 200
    assert b"didn't match" in response.content


@pytest.mark.parametrize("page", ["fleet", "traffic", "stages", "tenants", "rollouts", "scaling"])
def test_operator_pages_render_for_staff(people: dict[str, User], page: str) -> None:
    response = _client(people["staff"]).get(f"/dashboard/{page}/")
    assert response.status_code == 200
    assert b'data-page="' + page.encode() + b'"' in response.content


def test_unknown_page_is_404(people: dict[str, User]) -> None:
    assert _client(people["staff"]).get("/dashboard/nope/").status_code == 404


def test_plotly_is_served_from_the_package(people: dict[str, User]) -> None:
    response = Client().get("/dashboard/vendor/plotly.min.js")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/javascript"
    assert b"plotly" in b"".join(response.streaming_content)[:2000].lower()


def test_tenant_member_sees_only_their_tenant(people: dict[str, User]) -> None:
    alice = _client(people["alice"])
    response = alice.get("/dashboard/", follow=True)
    assert response.redirect_chain[-1][0] == "/dashboard/t/acme/"
    assert b'data-ws-tenant="acme"' in response.content
    assert alice.get("/dashboard/t/globex/").status_code == 404
    assert alice.get("/dashboard/t/missing/").status_code == 404
    for page in ("fleet", "traffic", "rollouts", "scaling"):
        response = alice.get(f"/dashboard/{page}/")
        assert response.status_code == 302
        assert "/accounts/login/" in response["Location"]


def test_user_without_tenant_is_told(people: dict[str, User]) -> None:
    response = _client(people["nobody"]).get("/dashboard/")
    assert response.status_code == 403
    assert b"not a member" in response.content


def test_cancel_button_cancels_with_csrf(people: dict[str, User], rollout: Rollout) -> None:
    staff = _client(people["staff"], csrf=True)
    page = staff.get("/dashboard/rollouts/")
    assert f'id="rollout-{rollout.pk}"'.encode() in page.content
    assert b'value="cancel">Cancel</button>' in page.content  # wired: enabled
    # a draft cannot be rolled back: the button is there, disabled until the rollout runs
    assert b'value="rollback" disabled>Roll back</button>' in page.content
    url = f"/dashboard/rollouts/{rollout.pk}/cancel/"
    assert staff.post(url, {"reason": "x"}).status_code == 403  # no CSRF token
    token = staff.cookies["csrftoken"].value
    response = staff.post(url, {"reason": "bad canary", "csrfmiddlewaretoken": token}, follow=True)
    assert response.status_code == 200
    assert b"cancel done" in response.content
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.CANCELLED
    assert rollout.events.filter(kind="cancelled").exists() or rollout.events.count() >= 2
    # a second cancel is refused by the service and said on the page
    again = staff.post(url, {"reason": "again", "csrfmiddlewaretoken": token}, follow=True)
    assert b"only a draft or warming" in again.content


def test_planned_action_and_non_staff_are_refused(
    people: dict[str, User], rollout: Rollout
) -> None:
    assert (
        _client(people["staff"]).post(f"/dashboard/rollouts/{rollout.pk}/launch/").status_code
        == 404
    )
    assert (
        _client(people["staff"]).get(f"/dashboard/rollouts/{rollout.pk}/cancel/").status_code == 405
    )
    response = _client(people["alice"]).post(
        f"/dashboard/rollouts/{rollout.pk}/cancel/", {"reason": "mine"}
    )
    assert response.status_code == 302
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.PENDING


@pytest.fixture
def candidate_replica() -> Iterator[Process]:
    process = start_simulator()  # serves tiny-llama, the rollout fixture's model
    try:
        yield process
    finally:
        process.stop()


def test_start_then_roll_back_from_the_page_moves_the_route_weights(
    people: dict[str, User],
    rollout: Rollout,
    namespace: str,
    eager_celery: None,
    candidate_replica: Process,
) -> None:
    """The wired buttons queue the Celery tasks (eager here): start (the warm-up's requests
    reach the candidate's replica, a simulator: the canary's first step takes traffic), then
    roll back: the model's route goes back to stable; the staff feed reports each task (done,
    or refused with the reason)."""
    pool = pool_create(actor=None, name="dash-cpu", hardware_tier="cpu", cost_per_replica_hour=1)
    urls = ("http://127.0.0.1:9100", candidate_replica.base_url)
    for url, version in zip(urls, (rollout.stable_version, rollout.candidate_version), strict=True):
        endpoint = endpoint_register(actor=None, pool=pool, version=version, base_url=url,
                                     capacity=4)  # fmt: skip
        endpoint_set_state(actor=None, endpoint=endpoint, state="ready")
    staff = _client(people["staff"], csrf=True)
    staff.get("/dashboard/rollouts/")
    token = staff.cookies["csrftoken"].value
    base = f"/dashboard/rollouts/{rollout.pk}"

    started = staff.post(f"{base}/start/", {"csrfmiddlewaretoken": token}, follow=True)
    assert b"start done" in started.content
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.RUNNING
    weights = {s.version_id: s.weight for s in Route.objects.get(model=rollout.model).splits.all()}
    assert weights[rollout.candidate_version_id] == rollout.steps[0]

    rolled = staff.post(
        f"{base}/rollback/", {"reason": "p95 too high", "csrfmiddlewaretoken": token}, follow=True
    )
    assert b"roll back done" in rolled.content
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.ROLLED_BACK
    splits = list(Route.objects.get(model=rollout.model).splits.all())
    assert [(s.version_id, s.weight) for s in splits] == [(rollout.stable_version_id, 100)]
    assert rollout.events.last().reason == "p95 too high"  # type: ignore[union-attr]
    refused = staff.post(f"{base}/advance/", {"csrfmiddlewaretoken": token}, follow=True)
    assert b"advance needs it to be running" in refused.content  # the service's refusal, shown
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url())
    try:
        feed = control_document(client, namespace)
    finally:
        client.delete(tasks_key(namespace))
        client.close()
    noted = [(t["action"], t["state"]) for t in feed["tasks"]]
    assert noted == [("advance", "refused"), ("rollback", "done"), ("start", "done")]
    assert "advance needs it to be running" in feed["tasks"][0]["said"]
    (view,) = [r for r in feed["rollouts"] if r["id"] == rollout.pk]
    assert view["state"] == "rolled_back"
    assert view["share"] == 0  # back on stable
    assert view["events"][-1]["reason"] == "p95 too high"


def test_without_a_worker_the_action_is_queued_and_shown_so(
    people: dict[str, User], rollout: Rollout, namespace: str
) -> None:
    """No eager Celery and no worker: the page says queued; the feed says queued; nothing
    changed yet (the worker makes the change, tests/browser runs one)."""
    staff = _client(people["staff"])
    response = staff.post(f"/dashboard/rollouts/{rollout.pk}/start/", {"reason": ""}, follow=True)
    assert b"start queued (task" in response.content
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url())
    try:
        (task,) = control_document(client, namespace)["tasks"]
        assert (task["action"], task["state"], task["rollout"]) == ("start", "queued", rollout.pk)
    finally:
        client.delete(tasks_key(namespace))
        client.close()
        with app.connection_for_write() as connection:  # the message no worker will take
            connection.default_channel.queue_purge(app.conf.task_default_queue)
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.PENDING
