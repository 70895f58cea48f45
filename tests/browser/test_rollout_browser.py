"""Rollout buttons and the scaling page in a real browser (Debian's Chromium), for real.

The platform here is built from the database: a real router follows the snapshots the control
plane publishes, two simulator endpoints serve the stable and candidate versions, a real Celery
worker runs the rollout tasks the buttons queue, and the control plane (uvicorn) relays the
routers' live documents and the staff feed to the page. The operator starts a canary, watches
the router's own route weights move to the first step, presses "Roll back", and the rollout's
state and the router's route weights change on the page (and in the router's published view)
within a bound. Screenshots go to the test's tmp dir.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis
from browser_platform import start_web, web_env
from django.contrib.auth.models import User
from fixtures.celery_worker import Worker
from fixtures.control_plane import endpoint_ready, tenants_with_keys, version_published
from fixtures.redis_keys import RouterNamespace
from fixtures.router import Process, start_router, start_simulator, wait_ready
from test_dashboard_browser import _login

from apps.models.services import model_create, pool_create, route_set
from apps.rollouts.models import Rollout
from apps.rollouts.services import rollout_create
from apps.scaling.models import ScalingDecision
from config.celery import app
from runtime.artifacts import manifest_digest
from runtime.telemetry.live import live_backlog

pytestmark = [pytest.mark.browser, pytest.mark.integration]

MODEL = "canary-chat"
FILES = {"model.safetensors": "cd" * 32}
TENANTS = [f"team-{i}" for i in range(8)]
MANIFEST = {"files": FILES, "max_context": 2048, "tokenizer": "tok", "default_sampling": {}}
WEIGHTS_JS = (
    "(id) => JSON.parse(document.querySelector(`#rollout-${id} .routes`).dataset.weights || '[]')"
)


@dataclass
class Stage:
    namespace: str
    router: Process
    web: Process
    keys: list[str]  # routes stick per tenant: several tenants reach both versions
    rollout: Rollout
    client: redis.Redis[bytes]

    @property
    def web_url(self) -> str:
        return self.web.base_url

    def router_routes(self) -> dict[str, int] | None:
        """The newest live document's routes for MODEL: the router's own view."""
        raw = self.client.lindex(live_backlog(self.namespace), 0)
        if raw is None:
            return None
        routes: dict[str, dict[str, int]] = msgspec.json.decode(raw).get("routes", {})
        return routes.get(MODEL)


@pytest.fixture
def stage(
    transactional_db: Any, router_namespace: RouterNamespace, tmp_path: Path
) -> Iterator[Stage]:
    namespace, prefix, client = (
        router_namespace.name,
        router_namespace.prefix,
        router_namespace.client,
    )
    started: list[Process] = []
    worker: Worker | None = None
    try:
        env = {**web_env(prefix, tmp_path / "var")}
        worker = Worker(app.conf.task_default_queue, env)  # starts while the rest is set up
        sims = [start_simulator(MODEL, "--decode-a-ms", "2") for _ in range(2)]
        started.extend(sims)
        model = model_create(actor=None, name=MODEL, task="chat")
        pool = pool_create(actor=None, name="sim", hardware_tier="cpu", cost_per_replica_hour="1")
        versions = []
        for label, sim in zip(("v1", "v2"), sims, strict=True):
            version = version_published(
                model, label, artifact_uri=f"file:///m/{label}", digest=manifest_digest(FILES),
                manifest=MANIFEST, runtime="vllm",
            )  # fmt: skip
            endpoint_ready(pool, version, sim.base_url)
            versions.append(version)
        route_set(actor=None, model=model, splits=[(versions[0], 100)])
        keys = list(tenants_with_keys(TENANTS, max_concurrency=100).values())
        rollout = rollout_create(
            actor=None, model=model, stable_version=versions[0], candidate_version=versions[1],
            mode="canary", steps=[50, 100], min_samples=10_000, step_window_s=3600,
        )  # fmt: skip
        User.objects.create_user("operator", password="op-pass-1", is_staff=True)
        router = start_router(prefix, tmp_path / "router")
        started.append(router)
        wait_ready(router, router_namespace.latest())
        web = start_web(prefix, tmp_path / "var")
        started.append(web)
        yield Stage(namespace, router, web, keys, rollout, client)
    finally:
        for process in reversed(started):
            process.stop()
        if worker is not None:
            worker.stop()


def _traffic(stage: Stage, stop: threading.Event) -> list[int]:
    """Requests to MODEL every 50 ms from every tenant, half of them streamed, in a thread
    (bounded by ``stop`` and 1200 requests)."""
    statuses: list[int] = []

    def run() -> None:
        for i in range(1200):
            if stop.wait(0.05):
                return
            key = stage.keys[i % len(stage.keys)]
            body = {"model": MODEL, "max_tokens": 8, "stream": i % 2 == 0,
                    "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
            request = urllib.request.Request(
                f"{stage.router.base_url}/v1/chat/completions", data=json.dumps(body).encode(),
                headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
            )  # fmt: skip
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    response.read()  # to the end (a stream's [DONE])
                    statuses.append(response.status)
            except OSError:
                statuses.append(0)

    threading.Thread(target=run, name="rollout-traffic", daemon=True).start()
    return statuses


def test_operator_rolls_back_a_running_rollout(browser: Any, stage: Stage, tmp_path: Path) -> None:
    rollout = stage.rollout
    page = _login(browser, stage, "operator", "op-pass-1")  # type: ignore[arg-type]
    page.goto(f"{stage.web_url}/dashboard/rollouts/")
    card = page.locator(f"#rollout-{rollout.pk}")
    assert card.get_attribute("data-state") == "pending"
    assert card.locator("button[value=rollback]").is_disabled()
    stop = threading.Event()
    statuses = _traffic(stage, stop)
    try:
        card.locator("button[value=start]").click()  # queued: the worker runs it
        assert "start queued" in page.inner_text(".message")
        page.wait_for_selector(f"#rollout-{rollout.pk}[data-state=running]", timeout=60_000)
        # the router's own route weights, on the page: the canary's first step
        page.wait_for_function(
            f"() => ({WEIGHTS_JS})({rollout.pk}).some(w => w.v2 === 50 && w.v1 === 50)",
            timeout=10_000,
        )
        for metric in ("requests", "ITL"):  # live stable vs candidate: both versions served
            page.wait_for_function(
                f"() => [...document.querySelectorAll('#rollout-{rollout.pk} .live-compare tr')]"
                f".some(tr => tr.cells[0].textContent.startsWith('{metric}')"
                " && +tr.cells[1].textContent > 0 && +tr.cells[2].textContent > 0)",
                timeout=10_000,
            )
        page.wait_for_function(  # the gates now, from the routers' per-version counters
            f"() => [...document.querySelectorAll('#rollout-{rollout.pk} .preview tr')]"
            ".some(tr => tr.cells.length === 4 && tr.cells[1].textContent === 'requests'"
            " && +tr.cells[2].textContent > 0 && +tr.cells[3].textContent > 0)",
            timeout=10_000,
        )
        assert "error_rate" in card.locator(".preview").inner_text()
        assert card.locator("button[value=rollback]").is_enabled()
        page.screenshot(path=str(tmp_path / "rollout-running.png"), full_page=True)

        card.locator("input[aria-label='reason for Roll back']").fill("p95 too high")
        pressed = time.monotonic()
        card.locator("button[value=rollback]").click()
        page.wait_for_selector(f"#rollout-{rollout.pk}[data-state=rolled_back]", timeout=15_000)
        state_s = time.monotonic() - pressed
        page.wait_for_function(
            f"() => {{ const w = ({WEIGHTS_JS})({rollout.pk});"
            " return w.length > 0 && w.every(r => r.v1 === 100 && !r.v2); }",
            timeout=10_000,
        )
        weights_s = time.monotonic() - pressed
        page.wait_for_selector(f"#rollout-{rollout.pk} .task[data-state=done]", timeout=5_000)
    finally:
        stop.set()
    print(f"roll back -> rolled_back on the page {state_s:.2f} s, router weights {weights_s:.2f} s")
    assert state_s < 15.0
    assert weights_s < 20.0
    assert stage.router_routes() == {"v1": 100}  # the router's published view
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.ROLLED_BACK
    assert rollout.events.last().reason == "p95 too high"  # type: ignore[union-attr]
    assert "p95 too high" in card.locator(".events").inner_text()
    assert statuses
    assert set(statuses) == {200}
    page.screenshot(path=str(tmp_path / "rollout-rolled-back.png"), full_page=True)
    page.close()


def test_scaling_page_shows_decisions_live(browser: Any, stage: Stage, tmp_path: Path) -> None:
    pool = stage.rollout.stable_version.endpoints.get().pool
    ScalingDecision.objects.create(
        pool=pool, policy="cpu", actuator="local", action="hold", current=2, desired=2,
        reason="utilisation 0.55 inside the band", signals={"inflight": 9, "capacity": 32},
    )  # fmt: skip
    page = _login(browser, stage, "operator", "op-pass-1")  # type: ignore[arg-type]
    page.click("nav >> text=Scaling")
    assert page.url.endswith("/dashboard/scaling/")
    card = page.locator("#pool-sim")
    assert "utilisation 0.55 inside the band" in card.locator(".decisions").inner_text()
    assert card.locator(".serving").inner_text() == "2"
    # a new decision appears without a reload (the staff feed), and on the chart
    ScalingDecision.objects.create(
        pool=pool, policy="cpu", actuator="local", action="out", current=2, desired=3,
        reason="queue wait p95 1.8 s above the 1 s SLO", signals={"queued": {"0": 6}},
    )  # fmt: skip
    page.wait_for_function(
        "() => document.querySelector('#pool-sim .decisions tbody tr')"
        ".textContent.includes('queue wait p95 1.8 s')",
        timeout=5_000,
    )
    page.wait_for_function(
        "() => (document.getElementById('chart-scaling-sim').data ?? [])"
        ".find(t => t.name === 'desired')?.y.at(-1) === 3",
        timeout=5_000,
    )
    page.screenshot(path=str(tmp_path / "scaling.png"), full_page=True)
    page.close()
