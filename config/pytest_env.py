"""pytest plugin (``-p config.pytest_env`` in pyproject's addopts): the test session's settings
environment, set before pytest-django loads the settings (a conftest is too late).

Outside DEBUG the settings need a SECRET_KEY (config/secret_key.py); the test session gets a
fixed test-only key unless SECRET_KEY is already set. The processes tests start inherit it.

Artifact signatures are required by default (runtime/signing.py); the test session makes them
optional (a present signature is still checked) unless SWITCHYARD_ARTIFACT_SIGNATURES is set,
because most tests register throwaway versions without signing them. The signature tests set
"required" themselves.
"""

from __future__ import annotations

import os
from typing import Final

import pytest

TEST_SECRET_KEY: Final = "switchyard-test-session-key-not-secret-0123456789"  # noqa: S105


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    if not os.environ.get("SECRET_KEY", "").strip() and not os.environ.get("SECRET_KEY_FILE"):
        os.environ["SECRET_KEY"] = TEST_SECRET_KEY
    os.environ.setdefault("SWITCHYARD_ARTIFACT_SIGNATURES", "optional")
