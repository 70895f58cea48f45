"""Model.fallback, Model.members (aliases) and ModelVersion.capabilities: validated where
written, carried in the snapshot."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from apps.core.selectors import snapshot_build
from apps.models.models import Model, ModelVersion
from apps.models.services import model_create, model_update, model_version_create
from apps.models.validators import capabilities_error

pytestmark = pytest.mark.db


def field_error(call: Callable[[], Any], field: str) -> str:
    with pytest.raises(ValidationError) as info:
        call()
    return " ".join(info.value.message_dict[field])


@pytest.mark.unit
@pytest.mark.parametrize(
    ("value", "ok"),
    [([], True), (["tools", "vision"], True), (["telepathy"], False), (["tools", "tools"], False),
     ("tools", False), (None, False)],
)  # fmt: skip
def test_capabilities_error(value: Any, ok: bool) -> None:
    assert (capabilities_error(value) is None) is ok


@pytest.mark.django_db
def test_fallbacks_are_same_task_models_without_cycles(llm: Model) -> None:
    small = model_create(actor=None, name="tiny-small", task="chat")
    tiny = model_create(actor=None, name="tinier", task="chat", fallback=small)
    embed = model_create(actor=None, name="embedder", task="embedding")
    model_update(actor=None, model=llm, fallback=tiny)
    assert Model.objects.get(pk=llm.pk).fallback == tiny
    cycle = field_error(lambda: model_update(actor=None, model=small, fallback=llm), "fallback")
    chain = "tiny-small -> tiny-llama -> tinier -> tiny-small"
    assert cycle == f"Fallbacks must not form a cycle: {chain}."
    own = field_error(lambda: model_update(actor=None, model=llm, fallback=llm), "fallback")
    assert own == "A model cannot be its own fallback."
    task = field_error(lambda: model_update(actor=None, model=llm, fallback=embed), "fallback")
    assert "must be a chat model; 'embedder' is a embedding model" in task


@pytest.mark.django_db
def test_aliases_list_models_of_their_task_and_have_no_versions(
    llm: Model, make_version: Callable[..., ModelVersion], manifest: dict[str, Any]
) -> None:
    small = model_create(actor=None, name="tiny-small", task="chat")
    model_create(actor=None, name="embedder", task="embedding")
    alias = model_create(actor=None, name="tiny", task="chat", members=["tiny-small", "tiny-llama"])
    assert alias.members == ["tiny-small", "tiny-llama"]

    def create(members: list[str], name: str = "fam") -> Any:
        return lambda: model_create(actor=None, name=name, task="chat", members=members)

    assert field_error(create(["ghost"]), "members") == "No model named 'ghost'."
    assert "not aliases: 'tiny'" in field_error(create(["tiny"]), "members")
    assert "chat models, not 'embedder'" in field_error(create(["embedder"]), "members")
    assert field_error(create(["fam"]), "members") == "An alias cannot list itself."
    assert field_error(create(["tiny-llama", "tiny-llama"]), "members") == (
        "Members must not repeat."
    )
    make_version("v1", publish=True)
    has_versions = field_error(
        lambda: model_update(actor=None, model=llm, members=["tiny-small"]), "members"
    )
    assert has_versions.startswith("A model with versions cannot be an alias")
    renamed = field_error(lambda: model_update(actor=None, model=small, name="x"), "name")
    assert "'tiny' list this model by name" in renamed
    version = field_error(
        lambda: model_version_create(
            actor=None, model=alias, label="v1", artifact_uri="file:///m", digest="ab" * 32,
            manifest=manifest, runtime="vllm",
        ),
        "model",
    )  # fmt: skip
    assert "is an alias of tiny-small, tiny-llama; it has no versions" in version
    fallback = field_error(lambda: model_update(actor=None, model=llm, fallback=alias), "fallback")
    assert fallback == "The fallback must be a model, not the alias 'tiny'."


@pytest.mark.django_db
def test_the_snapshot_carries_fallbacks_aliases_and_capabilities(
    llm: Model, make_version: Callable[..., ModelVersion]
) -> None:
    make_version("v1", publish=True, capabilities=["tools", "json_output"])
    bare = model_create(actor=None, name="unpublished", task="chat")
    model_update(actor=None, model=llm, fallback=bare)
    model_create(actor=None, name="tiny", task="chat", members=["unpublished", "tiny-llama"])
    model_create(actor=None, name="nothing-yet", task="chat", members=["unpublished"])
    snapshot = snapshot_build()
    assert snapshot.versions[next(iter(snapshot.versions))].capabilities == ("tools", "json_output")
    assert snapshot.models["tiny-llama"].fallback == ""  # the fallback has no version yet
    assert snapshot.aliases["tiny"].members == ("tiny-llama",)  # published members only
    assert snapshot.aliases["tiny"].task == "chat"
    assert "nothing-yet" not in snapshot.aliases
    assert "tiny" not in snapshot.models
    bad = field_error(lambda: make_version("v2", capabilities=["telepathy"]), "capabilities")
    assert bad.startswith("Unknown capabilities: 'telepathy'")


@pytest.mark.django_db
def test_the_admin_sets_a_fallback_and_members(admin_client: Any, llm: Model) -> None:
    url = reverse("admin:registry_model_add")
    form = {"name": "fam", "task": "chat", "members": '["ghost"]', "cache_ttl_s": "60"}
    response = admin_client.post(url, form)
    assert response.status_code == 200
    assert "No model named" in response.content.decode()
    response = admin_client.post(url, {**form, "members": '["tiny-llama"]'})
    assert response.status_code == 302
    assert Model.objects.get(name="fam").members == ["tiny-llama"]
    small = {"name": "small", "task": "chat", "members": "", "cache_ttl_s": "60"}
    assert admin_client.post(url, {**small, "fallback": str(llm.pk)}).status_code == 302
    assert Model.objects.get(name="small").fallback == llm
