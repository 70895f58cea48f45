"""The operator's tenants page says what it shows: an empty chart's time axis is now (not
plotly's default January 2000), the share table lists the tenants that sent traffic (also when
none of them had to wait, so the fairness view is empty), and credits point to where they are.

Its own module, so the module-scoped router starts without another test's live documents."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from browser_platform import Platform
from test_dashboard_browser import _login, traffic, users  # noqa: F401 - users: a fixture

pytestmark = [pytest.mark.browser, pytest.mark.integration]

TENANT_CELLS_JS = (
    "() => [...document.querySelectorAll('#table-shares tbody tr')]"
    ".map((row) => row.cells.length > 1 ? row.cells[1].textContent : '').filter(Boolean).join()"
)


@pytest.mark.usefixtures("users")
def test_tenants_page_words(browser: Any, platform: Platform, tmp_path: Path) -> None:
    page = _login(browser, platform, "operator", "op-pass-1")
    page.goto(f"{platform.web_url}/dashboard/tenants/")
    page.wait_for_selector("#live-status[data-state=live]", timeout=10_000)
    page.wait_for_function(  # drawn, with no tenant yet
        "() => document.getElementById('chart-tenants')._fullLayout !== undefined", timeout=5_000
    )
    assert page.evaluate("document.getElementById('chart-tenants').data.length") == 0
    years = page.evaluate(
        "() => document.getElementById('chart-tenants')._fullLayout.xaxis.range"
        ".map((end) => new Date(end).getFullYear())"
    )
    this_year = page.evaluate("new Date().getFullYear()")
    assert years == [this_year, this_year]
    page.wait_for_function(  # routers publish, nobody sent anything
        "() => document.querySelector('#table-shares tbody td').textContent"
        " === 'no tenant traffic in the last minute'",
        timeout=5_000,
    )
    words = page.inner_text("main")
    assert "planned" not in words
    assert "/dashboard/t/<slug>/" in words
    with traffic(platform, seconds=10.0) as statuses:
        page.wait_for_function(f"({TENANT_CELLS_JS})() === 'acme,globex'", timeout=8_000)
    assert statuses
    assert "no data yet" not in page.inner_text("#table-shares")
    page.screenshot(path=str(tmp_path / "tenants.png"), full_page=True)
    page.close()
