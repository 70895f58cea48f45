"""`switchyard up` prints the dashboard's address."""

from __future__ import annotations

import pytest

from apps.core.up_console import Addresses, banner

pytestmark = pytest.mark.unit

ENV = {"DATABASE_URL": "postgres://h/db", "REDIS_URL": "redis://h/0", "SWITCHYARD_VAR_DIR": "/v"}


@pytest.mark.unit
def test_the_banner_prints_the_dashboard_address() -> None:
    at = Addresses(web="http://127.0.0.1:8000", router="http://127.0.0.1:8080", pool=None)
    text = banner(ENV, at=at, seed={"operator_username": "operator"}, worker_log="/v/l")
    assert "dashboard        http://127.0.0.1:8000/dashboard/" in text
