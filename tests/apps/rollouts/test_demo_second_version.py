"""``make_demo_model --seed N`` makes a second version of the demo model (a rollout candidate)
next to the first, in its own folder, without touching the first one's files."""

from __future__ import annotations

from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command

from apps.models.models import ModelVersion

pytestmark = [pytest.mark.db, pytest.mark.django_db]


def test_seed_one_registers_v2_beside_v1(settings: Any, tmp_path: Path) -> None:
    settings.VAR_DIR = tmp_path
    call_command("make_demo_model", stdout=StringIO())
    first_digest = ModelVersion.objects.get(label="v1").digest
    out = StringIO()
    call_command("make_demo_model", "--seed", "1", stdout=out)

    versions = {v.label: v for v in ModelVersion.objects.select_related("model")}
    assert set(versions) == {"v1", "v2"}
    assert versions["v1"].model == versions["v2"].model
    assert versions["v2"].digest != versions["v1"].digest == first_digest
    assert versions["v2"].is_published
    assert versions["v2"].artifact_uri == (tmp_path / "models/demo-llama-seed1").as_uri()
    assert "registered demo-llama:v2" in out.getvalue()
