"""The dashboard in a real browser (Debian's Chromium) against a running platform.

Log in, send traffic through the router, watch the traffic chart gain points within 2 s; a
tenant user sees only their tenant, and the browser's own forged websocket subscription to
another tenant is refused; the tenant page lists the tenant's batches with a progress bar.
Screenshots go to the test's tmp dir.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from browser_platform import ADAPTER, MODEL, Platform
from django.contrib.auth.models import User
from django.utils import timezone
from fixtures.wait import eventually

from apps.batches.models import Batch
from apps.models.services import model_create, model_version_create, model_version_publish
from apps.rollouts.models import Rollout
from apps.rollouts.services import rollout_create
from apps.tenants.models import Membership, Tenant
from runtime.artifacts import manifest_digest

pytestmark = [pytest.mark.browser, pytest.mark.integration]

POINTS_JS = (
    "() => { const el = document.getElementById('chart-rate');"
    " return el && el.data ? el.data[0].x.length : 0; }"
)


def _tenant(slug: str) -> Tenant:
    return Tenant.objects.create(
        slug=slug,
        name=slug.title(),
        rpm_limit=6000,
        tpm_limit=10**7,
        max_concurrency=50,
        max_context_tokens=4096,
        max_output_tokens=256,
    )


@pytest.fixture
def users(platform: Platform) -> dict[str, User]:
    acme, _globex = _tenant("acme"), _tenant("globex")
    staff = User.objects.create_user("operator", password="op-pass-1", is_staff=True)
    alice = User.objects.create_user("alice", password="alice-pass-1")
    Membership.objects.create(user=alice, tenant=acme, role="viewer")
    return {"staff": staff, "alice": alice}


@contextmanager
def traffic(platform: Platform, *, seconds: float = 20.0) -> Iterator[list[int]]:
    """Requests from acme and globex in a thread, bounded in count and time."""
    stop = threading.Event()
    statuses: list[int] = []

    def send(key: str, stream: bool) -> None:
        body = json.dumps(
            {
                "model": MODEL,
                "max_tokens": 8,
                "stream": stream,  # streams give the inter-token latency
                "messages": [{"role": "user", "content": "hello dashboard"}],
            }
        )
        request = urllib.request.Request(
            f"{platform.router.base_url}/v1/chat/completions",
            data=body.encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()  # to the end (a stream's [DONE])
            statuses.append(response.status)

    def run() -> None:
        for i in range(int(seconds * 10)):
            if stop.wait(0.1):
                return
            send(platform.world.secrets["acme" if i % 2 else "globex"], stream=i % 4 < 2)

    thread = threading.Thread(target=run, name="dashboard-traffic", daemon=True)
    thread.start()
    try:
        yield statuses
    finally:
        stop.set()
        thread.join(timeout=15)


def _login(browser: Any, platform: Platform, username: str, password: str) -> Any:
    page = browser.new_page(viewport={"width": 1366, "height": 900})
    page.goto(f"{platform.web_url}/dashboard/")
    assert "/accounts/login/" in page.url
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector("#live-status[data-state=live]", timeout=10_000)
    return page


def test_operator_watches_traffic_chart_move(
    browser: Any, platform: Platform, users: dict[str, User], tmp_path: Path
) -> None:
    page = _login(browser, platform, "operator", "op-pass-1")
    assert page.url.endswith("/dashboard/traffic/")
    with traffic(platform) as statuses:
        # the first document arrives and is drawn ...
        page.wait_for_function(f"({POINTS_JS})() > 0", timeout=5_000)
        before = page.evaluate(POINTS_JS)
        # ... and within 2 s the chart has more points
        page.wait_for_function(f"({POINTS_JS})() > {before}", timeout=2_000)
        page.wait_for_function(
            "() => Math.max(0, ...(document.getElementById('chart-rate').data?.[0]?.y ?? [])) > 0",
            timeout=5_000,
        )
        page.wait_for_function(  # TTFT per class, with its SLO line
            "() => (document.getElementById('chart-ttft').data ?? [])"
            ".some(t => t.name.includes('SLO'))",
            timeout=5_000,
        )
        page.wait_for_function(  # inter-token latency per class from the live aggregate
            "() => (document.getElementById('chart-itl').data ?? [])"
            ".some(t => t.name.endsWith('p95') && t.y.some(v => v > 0))",
            timeout=5_000,
        )
        page.wait_for_function(  # an operator sees every tenant
            "() => window.switchyardDashboard.tenants().join() === 'acme,globex'", timeout=5_000
        )
    assert statuses
    assert set(statuses) == {200}
    page.screenshot(path=str(tmp_path / "traffic.png"), full_page=True)
    page.emulate_media(color_scheme="dark")
    page.wait_for_function(  # the charts redraw in the dark theme's colours
        "() => document.getElementById('chart-rate').layout.font.color"
        " === getComputedStyle(document.body).color",
        timeout=3_000,
    )
    page.screenshot(path=str(tmp_path / "traffic-dark.png"), full_page=True)
    # a lost websocket reconnects and backfills what it missed
    held = page.evaluate("window.switchyardDashboard.documents()")
    page.evaluate("window.switchyardDashboard.drop()")
    page.wait_for_selector("#live-status[data-state=down]", timeout=2_000)
    page.wait_for_selector("#live-status[data-state=live]", timeout=5_000)
    page.wait_for_function(f"() => window.switchyardDashboard.documents() >= {held}", timeout=5_000)
    page.goto(f"{platform.web_url}/dashboard/fleet/")
    page.wait_for_function(
        "() => document.querySelector('#table-endpoints tbody td').textContent === '1'",
        timeout=5_000,
    )
    page.screenshot(path=str(tmp_path / "fleet.png"), full_page=True)
    page.goto(f"{platform.web_url}/dashboard/stages/")
    page.wait_for_function(
        "() => document.getElementById('chart-stages').data?.length === 4", timeout=5_000
    )
    page.screenshot(path=str(tmp_path / "stages.png"), full_page=True)
    page.close()


def test_fleet_page_shows_resident_adapters(
    browser: Any, platform: Platform, users: dict[str, User], tmp_path: Path
) -> None:
    page = _login(browser, platform, "operator", "op-pass-1")
    body = json.dumps({"model": ADAPTER, "max_tokens": 2, "messages": [{"role": "user",
                       "content": "hi"}]})  # fmt: skip
    request = urllib.request.Request(
        f"{platform.router.base_url}/v1/chat/completions",
        data=body.encode(),
        headers={"Authorization": f"Bearer {platform.world.secrets['acme']}",
                 "Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=10) as response:  # loads it on endpoint 1
        assert json.loads(response.read())["model"] == f"{ADAPTER}@v1"
    page.goto(f"{platform.web_url}/dashboard/fleet/")
    page.wait_for_function(  # the endpoint's row names the adapter resident there
        "() => [...document.querySelectorAll('#table-endpoints tbody tr')].some((tr) =>"
        f" tr.cells[0].textContent === '1' && tr.cells[8].textContent === '{ADAPTER}@v1')",
        timeout=5_000,
    )
    page.screenshot(path=str(tmp_path / "fleet-adapters.png"), full_page=True)
    page.close()


def test_tenant_sees_only_their_tenant(
    browser: Any, platform: Platform, users: dict[str, User], tmp_path: Path
) -> None:
    page = _login(browser, platform, "alice", "alice-pass-1")
    assert page.url.endswith("/dashboard/t/acme/")
    with traffic(platform, seconds=10.0) as statuses:
        page.wait_for_function(
            "() => window.switchyardDashboard.tenants().length > 0", timeout=5_000
        )
        eventually(lambda: len(statuses) >= 10, timeout=10.0, what="ten requests, half globex")
        held = page.evaluate("window.switchyardDashboard.documents()")
        # two more seconds of documents, so globex's requests have been published
        page.wait_for_function(
            f"() => window.switchyardDashboard.documents() >= {held + 2}", timeout=5_000
        )
    assert page.evaluate("window.switchyardDashboard.tenants()") == ["acme"]
    # the browser itself forges a subscription to globex: refused
    forged = page.evaluate("""() => new Promise((resolve) => {
        const ws = new WebSocket(`ws://${location.host}/ws/live/?tenant=globex`);
        ws.onclose = (event) => resolve(event.code);
    })""")
    assert forged == 4403
    assert page.goto(f"{platform.web_url}/dashboard/t/globex/").status == 404
    page.goto(f"{platform.web_url}/dashboard/t/acme/")  # a reload backfills the chart
    page.wait_for_function(
        "() => Math.max(0, ...(document.getElementById('chart-usage').data?.[0]?.y ?? [])) > 0",
        timeout=5_000,
    )
    page.screenshot(path=str(tmp_path / "tenant.png"), full_page=True)
    page.close()


def _rollout() -> Rollout:
    files = {"model.safetensors": "cd" * 32}
    model = model_create(actor=None, name="canary-chat", task="chat")
    versions = [
        model_version_publish(
            actor=None,
            version=model_version_create(
                actor=None,
                model=model,
                label=label,
                artifact_uri=f"file:///m/{label}",
                digest=manifest_digest(files),
                runtime="vllm",
                manifest={
                    "tokenizer": "t",
                    "max_context": 2048,
                    "default_sampling": {},
                    "files": files,
                },
            ),
        )
        for label in ("v1", "v2")
    ]
    return rollout_create(
        actor=None,
        model=model,
        stable_version=versions[0],
        candidate_version=versions[1],
        mode="canary",
    )


def test_operator_cancels_a_rollout(
    browser: Any, platform: Platform, users: dict[str, User], tmp_path: Path
) -> None:
    rollout = _rollout()
    page = _login(browser, platform, "operator", "op-pass-1")
    page.goto(f"{platform.web_url}/dashboard/rollouts/")
    card = page.locator(f"#rollout-{rollout.pk}")
    assert card.get_attribute("data-state") == "pending"
    assert card.locator("button[value=cancel]").is_enabled()
    assert card.locator("button[value=rollback]").is_disabled()  # a draft does not run yet
    card.locator("input[aria-label='reason for Cancel']").fill("bad canary")
    card.locator("button[value=cancel]").click()
    page.wait_for_selector(f"#rollout-{rollout.pk}[data-state=cancelled]", timeout=5_000)
    assert "cancel done" in page.inner_text(".message")
    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.CANCELLED
    assert rollout.events.last().reason == "bad canary"  # type: ignore[union-attr]
    page.screenshot(path=str(tmp_path / "rollouts.png"), full_page=True)
    page.close()


def test_tenant_page_lists_its_batches_with_progress(
    browser: Any, platform: Platform, users: dict[str, User], tmp_path: Path
) -> None:
    acme, globex = Tenant.objects.get(slug="acme"), Tenant.objects.get(slug="globex")
    expires = timezone.now() + timedelta(hours=24)
    for tenant, name, status, done in ((acme, "batch_acme1", "in_progress", 30),
                                       (globex, "batch_globex1", "in_progress", 10)):
        Batch.objects.create(public_id=name, tenant=tenant, endpoint="/v1/chat/completions",
                             status=status, total=120, completed=done, failed=6,
                             expires_at=expires)  # fmt: skip
    page = _login(browser, platform, "alice", "alice-pass-1")
    assert page.url.endswith("/dashboard/t/acme/")
    rows = page.locator("#table-batches tbody tr")
    assert rows.count() == 1  # acme's only: globex's batch is not shown
    row = page.locator("#table-batches tr[data-batch=batch_acme1]")
    assert row.locator("progress").get_attribute("value") == "30"  # (30 + 6) of 120
    assert "30 / 6 / 120" in row.inner_text()
    assert "in_progress" in row.inner_text()
    page.screenshot(path=str(tmp_path / "tenant-batches.png"), full_page=True)
    page.close()
