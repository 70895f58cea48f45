"""Suite-wide fixtures. Services come from DATABASE_URL / REDIS_URL (see platform/test)."""

from __future__ import annotations

import os
import shutil

import pytest

# Session fixtures: the demo model artifact and one shared real vLLM CPU engine; a Redis client
# and a key prefix of the test's own.
pytest_plugins = ["fixtures.vllm_engine", "fixtures.redis_keys"]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU tests need an NVIDIA GPU; CI has none, so they skip and say so."""
    if shutil.which("nvidia-smi") and os.environ.get("SWITCHYARD_SKIP_GPU") != "1":
        return
    skip = pytest.mark.skip(
        reason="no NVIDIA GPU on this machine (gpu tests run on the device box)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
