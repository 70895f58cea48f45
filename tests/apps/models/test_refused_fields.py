"""Model.refused_fields: validated where written (service and admin), carried in the snapshot."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from apps.core.selectors import snapshot_build
from apps.models.models import Model
from apps.models.services import model_create, model_update
from apps.models.validators import refused_fields_error

pytestmark = pytest.mark.db


@pytest.mark.unit
@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ([], True),
        (["logit_bias", "guided_json", "top_k"], True),
        ("logit_bias", False),
        ([1], False),
        (["bad name"], False),
        (["a.b"], False),
        (["x", "x"], False),
        (["model"], False),
        (["messages"], False),
        (None, False),
    ],
)
def test_refused_fields_error(value: Any, ok: bool) -> None:
    assert (refused_fields_error(value) is None) is ok


@pytest.mark.db
@pytest.mark.django_db
def test_the_service_validates_and_the_snapshot_carries_them(make_version: Any, llm: Model) -> None:
    make_version("v1", publish=True)
    assert snapshot_build().models["tiny-llama"].refused_fields == ()  # empty by default
    model_update(actor=None, model=llm, refused_fields=["logit_bias", "top_k"])
    assert snapshot_build().models["tiny-llama"].refused_fields == ("logit_bias", "top_k")
    with pytest.raises(ValidationError) as info:
        model_update(actor=None, model=llm, refused_fields=["input"])
    assert "refused_fields" in info.value.message_dict
    with pytest.raises(ValidationError):
        model_create(actor=None, name="other", task="chat", refused_fields=["a b"])


@pytest.mark.db
@pytest.mark.django_db
def test_the_admin_shows_a_bad_list_as_a_form_error(admin_client: Any) -> None:
    url = reverse("admin:registry_model_add")
    form = {"name": "guarded", "task": "chat", "refused_fields": '["prompt"]'}
    response = admin_client.post(url, form)
    assert response.status_code == 200
    assert "cannot be refused" in response.content.decode()
    assert not Model.objects.exists()
    response = admin_client.post(url, {**form, "refused_fields": '["logit_bias"]'})
    assert response.status_code == 302
    assert Model.objects.get(name="guarded").refused_fields == ["logit_bias"]
    response = admin_client.post(url, {"name": "open", "task": "chat", "refused_fields": ""})
    assert response.status_code == 302
    assert Model.objects.get(name="open").refused_fields == []
