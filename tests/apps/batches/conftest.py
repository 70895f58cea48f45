"""Fixtures of the Batch API's control-plane tests: the files' storage in a temporary
directory and a test at-rest keyring, a tenant with a chat model, and signed requests to the
views."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from batch_support import KEYRING, MODEL, SECRET, make_tenant

from apps.models.services import model_create
from apps.tenants.models import Tenant


@pytest.fixture(autouse=True)
def batch_settings(settings: Any, tmp_path: Path) -> None:
    settings.STORAGES = {
        **settings.STORAGES,
        "batches": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(tmp_path / "batch-files")},
        },
    }
    settings.INTERNAL_SECRET = SECRET
    settings.AT_REST_KEYS = KEYRING  # the files' encryption: a test keyring, not the var dir's


@pytest.fixture
def tenant(db: None) -> Tenant:
    model_create(actor=None, name=MODEL, task="chat")
    return make_tenant("acme")
