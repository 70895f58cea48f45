"""model_create / model_update / model_version_create / _update / _publish."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from apps.common.models import AuditEvent
from apps.models.models import Model, ModelVersion
from apps.models.services import (
    model_create,
    model_update,
    model_version_create,
    model_version_publish,
    model_version_update,
)

pytestmark = [pytest.mark.db, pytest.mark.django_db]


def errors_of(excinfo: pytest.ExceptionInfo[ValidationError]) -> dict[str, list[str]]:
    return excinfo.value.message_dict


# --- models ---------------------------------------------------------------------------------


def test_model_create_audits_and_publishes(admin_user, publishes):
    model = model_create(actor=admin_user, name="org/Llama-3.2-1B", task="chat")

    assert Model.objects.get(pk=model.pk).task == "chat"
    event = AuditEvent.objects.get(action="model.create")
    assert event.actor_label == admin_user.username
    assert event.target_type == "registry.model"
    assert event.after == {
        "name": "org/Llama-3.2-1B",
        "task": "chat",
        "description": "",
        "refused_fields": [],
    }
    assert publishes.pending


@pytest.mark.parametrize("name", ["", "-lead", "trail-", "has space", "a//b", "x" * 101, "ünï"])
def test_model_create_refuses_bad_name(db, name):
    with pytest.raises(ValidationError) as excinfo:
        model_create(actor=None, name=name, task="chat")
    assert "name" in errors_of(excinfo)
    assert not Model.objects.exists()


def test_model_create_refuses_unknown_task(db):
    with pytest.raises(ValidationError) as excinfo:
        model_create(actor=None, name="m", task="translation")
    assert "Task must be one of" in errors_of(excinfo)["task"][0]


def test_model_create_refuses_duplicate_name(llm):
    with pytest.raises(ValidationError) as excinfo:
        model_create(actor=None, name=llm.name, task="chat")
    assert errors_of(excinfo)["name"] == ["A model named 'tiny-llama' already exists."]


def test_model_update_changes_and_audits(llm, publishes):
    publishes.reset()
    model_update(actor=None, model=llm, description="the demo model", task="completion")

    llm.refresh_from_db()
    assert (llm.description, llm.task) == ("the demo model", "completion")
    event = AuditEvent.objects.get(action="model.update")
    assert event.actor_label == "system"
    assert event.before["task"] == "chat"
    assert event.after["task"] == "completion"
    assert publishes.pending


def test_model_update_refuses_unknown_field_and_bad_task(llm):
    with pytest.raises(ValidationError) as excinfo:
        model_update(actor=None, model=llm, created_at=None)
    assert "created_at" in errors_of(excinfo)
    with pytest.raises(ValidationError):
        model_update(actor=None, model=llm, task="nope")


# --- versions: create -----------------------------------------------------------------------


def test_version_create_audits_and_publishes(llm, manifest, publishes):
    publishes.reset()
    version = model_version_create(
        actor=None, model=llm, label="v1", artifact_uri="file:///m/v1", digest="0" * 64,
        manifest=manifest, runtime="vllm", memory_gb=2.5, tensor_parallel_size=2,
    )  # fmt: skip

    assert version.published_at is None
    assert str(version) == "tiny-llama:v1"
    event = AuditEvent.objects.get(action="model_version.create")
    assert event.after["manifest"] == manifest
    assert event.after["tensor_parallel_size"] == 2
    assert publishes.pending


def test_version_create_accepts_a_partial_manifest_for_a_draft(make_version):
    version = make_version("wip", manifest={"tokenizer": "tok"})
    assert version.manifest == {"tokenizer": "tok"}


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"digest": "AB" * 32}, "digest"),
        ({"digest": "ab" * 31}, "digest"),
        ({"digest": "zz" * 32}, "digest"),
        ({"label": "bad label"}, "label"),
        ({"artifact_uri": ""}, "artifact_uri"),
        ({"artifact_uri": " file:///x"}, "artifact_uri"),
        ({"runtime": "tensorrt"}, "runtime"),
        ({"memory_gb": -1.0}, "memory_gb"),
        ({"memory_gb": float("nan")}, "memory_gb"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"tensor_parallel_size": True}, "tensor_parallel_size"),
        ({"manifest": ["not", "a", "dict"]}, "manifest"),
        ({"manifest": {"tokenizer": ""}}, "manifest"),
        ({"manifest": {"max_context": 0}}, "manifest"),
        ({"manifest": {"max_context": "2048"}}, "manifest"),
        ({"manifest": {"default_sampling": []}}, "manifest"),
        ({"manifest": {"files": {"model.bin": "short"}}}, "manifest"),
        ({"manifest": {"files": {"/etc/passwd": "ab" * 32}}}, "manifest"),
        ({"manifest": {"files": {"../up.bin": "ab" * 32}}}, "manifest"),
        ({"manifest": {"files": ["model.bin"]}}, "manifest"),
    ],
)
def test_version_create_refuses_bad_values(make_version, overrides, field):
    label = overrides.pop("label", "v9")
    with pytest.raises(ValidationError) as excinfo:
        make_version(label, **overrides)
    assert field in errors_of(excinfo)
    assert not ModelVersion.objects.exists()


def test_version_create_refuses_duplicate_label(make_version):
    make_version("v1")
    with pytest.raises(ValidationError) as excinfo:
        make_version("v1")
    assert errors_of(excinfo)["label"] == [
        "Model 'tiny-llama' already has a version labelled 'v1'."
    ]


# --- versions: publish ----------------------------------------------------------------------


def test_publish_sets_published_at_audits_and_publishes(draft, admin_user, publishes):
    publishes.reset()
    returned = model_version_publish(actor=admin_user, version=draft)

    assert returned is draft
    assert draft.is_published
    assert ModelVersion.objects.get(pk=draft.pk).published_at == draft.published_at
    event = AuditEvent.objects.get(action="model_version.publish")
    assert event.before == {"published_at": None}
    assert event.after["published_at"]
    assert publishes.pending


def test_publish_twice_is_refused(published):
    with pytest.raises(ValidationError, match="already published"):
        model_version_publish(actor=None, version=published)


def test_publish_refuses_an_incomplete_manifest(make_version):
    version = make_version("wip", manifest={"tokenizer": "tok", "max_context": 128})
    with pytest.raises(ValidationError) as excinfo:
        model_version_publish(actor=None, version=version)
    assert "missing required key(s): default_sampling, files" in errors_of(excinfo)["manifest"][0]
    version.refresh_from_db()
    assert version.published_at is None


def test_publish_refuses_a_digest_that_does_not_match_the_files(make_version):
    version = make_version("wip", digest="0" * 64)
    with pytest.raises(ValidationError) as excinfo:
        model_version_publish(actor=None, version=version)
    [message] = errors_of(excinfo)["digest"]
    assert message.startswith("Digest does not match the manifest's files: they digest to ")
    assert not ModelVersion.objects.get(pk=version.pk).is_published


# --- versions: update -----------------------------------------------------------------------


def test_update_changes_a_draft(draft, publishes):
    publishes.reset()
    model_version_update(actor=None, version=draft, runtime="simulator", memory_gb=0.5)

    assert (draft.runtime, draft.memory_gb) == ("simulator", 0.5)
    event = AuditEvent.objects.get(action="model_version.update")
    assert event.before["runtime"] == "vllm"
    assert event.after["runtime"] == "simulator"
    assert publishes.pending


def test_update_refuses_bad_values_on_a_draft(draft):
    with pytest.raises(ValidationError) as excinfo:
        model_version_update(actor=None, version=draft, digest="nope")
    assert "digest" in errors_of(excinfo)


def test_update_refuses_unknown_fields(draft):
    with pytest.raises(ValidationError) as excinfo:
        model_version_update(actor=None, version=draft, published_at=None)
    assert "published_at" in errors_of(excinfo)


@pytest.mark.parametrize(
    "change",
    [
        {"artifact_uri": "file:///elsewhere"},
        {"digest": "0" * 64},
        {"manifest": {"tokenizer": "other"}},
        {"runtime": "simulator"},
        {"memory_gb": 4.0},
        {"tensor_parallel_size": 2},
        {"label": "v1-renamed"},
    ],
)
def test_update_of_a_published_version_is_refused(published, change):
    before = ModelVersion.objects.values().get(pk=published.pk)
    with pytest.raises(ValidationError, match="is published and immutable"):
        model_version_update(actor=None, version=published, **change)
    assert ModelVersion.objects.values().get(pk=published.pk) == before
    assert not AuditEvent.objects.filter(action="model_version.update").exists()
