"""LoRA adapters in the registry: a version naming its base version, validated where written,
carried in the snapshot, listed by the router's /v1/models with ``parent``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from django.core.exceptions import ValidationError

from apps.core.selectors import snapshot_build
from apps.models.models import Model, ModelVersion, Pool
from apps.models.selectors import lora_settings
from apps.models.services import model_create, model_version_create, model_version_publish
from apps.scaling.models import ReplicaStart
from runtime.gateway.service import model_entry
from runtime.snapshot import adapter_name

pytestmark = [pytest.mark.db, pytest.mark.django_db]


def field_error(call: Callable[[], Any], field: str) -> str:
    with pytest.raises(ValidationError) as info:
        call()
    return " ".join(info.value.message_dict[field])


@pytest.fixture
def adapter_model(llm: Model) -> Model:
    return model_create(actor=None, name="tiny-llama-support", task="chat")


def _adapter(
    model: Model, base: ModelVersion, manifest: dict[str, Any], **extra: Any
) -> ModelVersion:
    values: dict[str, Any] = {
        "label": "v1", "artifact_uri": "file:///adapters/support", "digest": base.digest,
        "manifest": {**manifest, "lora_rank": 8}, "runtime": "vllm", "base_version": base, **extra,
    }  # fmt: skip
    return model_version_create(actor=None, model=model, **values)


def test_adapter_is_published_on_a_published_base_and_snapshotted(
    make_version: Callable[..., ModelVersion], adapter_model: Model, manifest: dict[str, Any]
) -> None:
    base = make_version("v1")
    adapter = _adapter(adapter_model, base, manifest)
    assert adapter.is_adapter
    assert list(base.adapters.all()) == [adapter]
    early = field_error(lambda: model_version_publish(actor=None, version=adapter), "base_version")
    assert early == "Publish the base version tiny-llama:v1 first."
    model_version_publish(actor=None, version=base)
    model_version_publish(actor=None, version=adapter)
    snapshot = snapshot_build()
    snap = snapshot.versions[adapter.pk]
    assert (snap.base_version, snap.lora_rank) == (base.pk, 8)
    assert snapshot.versions[base.pk].base_version is None
    assert adapter_name(snap) == "tiny-llama-support@v1"
    entry = model_entry(snapshot, "tiny-llama-support", 0)
    assert entry["parent"] == "tiny-llama"
    assert "parent" not in model_entry(snapshot, "tiny-llama", 0)
    # the base's replicas start with LoRA on, sized for the published adapters
    assert lora_settings(base, {}) == (2, 8, 8)
    assert lora_settings(base, {"max_loras": "4", "max_cpu_loras": "12"}) == (4, 12, 8)


def test_no_published_adapter_no_lora(make_version: Callable[..., ModelVersion]) -> None:
    assert lora_settings(make_version("v1", publish=True), {}) == (0, 0, 8)


def test_base_version_errors(
    make_version: Callable[..., ModelVersion], llm: Model, adapter_model: Model,
    manifest: dict[str, Any],
) -> None:  # fmt: skip
    base = make_version("v1")
    own = field_error(lambda: _adapter(llm, base, manifest, label="lora"), "base_version")
    assert own == "An adapter's base version must belong to another model."
    runtime = field_error(
        lambda: _adapter(adapter_model, base, manifest, runtime="simulator"), "base_version"
    )
    assert runtime == "The adapter's runtime 'simulator' differs from its base's 'vllm'."
    torch = field_error(
        lambda: _adapter(adapter_model, base, manifest, runtime="torch"), "base_version"
    )
    assert torch.startswith("Adapters run on ['vllm', 'simulator'], not 'torch'")
    adapter = _adapter(adapter_model, base, manifest)
    other = model_create(actor=None, name="stacked", task="chat")
    stacked = field_error(lambda: _adapter(other, adapter, manifest), "base_version")
    assert stacked == "tiny-llama-support:v1 is itself an adapter; name a full model's version."
    embed = model_create(actor=None, name="embedder", task="embedding")
    task = field_error(lambda: _adapter(embed, base, manifest), "base_version")
    assert task == "Model 'embedder' is embedding, its base tiny-llama:v1 is chat."


def test_an_adapter_scales_from_zero_with_its_base(
    make_version: Callable[..., ModelVersion], adapter_model: Model, manifest: dict[str, Any]
) -> None:
    """A request for an adapter on a pool at zero replicas waits for the base's replica to
    start (or gets 503 with Retry-After), as a request for the base does: the snapshot gives
    the adapter its base's scale-from-zero pool and start time."""
    base = make_version("v1")
    model_version_publish(actor=None, version=base)
    adapter = _adapter(adapter_model, base, manifest)
    model_version_publish(actor=None, version=adapter)
    pool = Pool.objects.create(name="lora-zero", hardware_tier="cpu", min_replicas=0,
                               max_replicas=1)  # fmt: skip
    ReplicaStart.objects.create(pool=pool, version=base, warm=False, seconds=42.0)
    versions = snapshot_build().versions
    assert (versions[base.pk].scale_pool, versions[base.pk].cold_start_s) == ("lora-zero", 42.0)
    assert (versions[adapter.pk].scale_pool, versions[adapter.pk].cold_start_s) == (
        "lora-zero", 42.0,
    )  # fmt: skip
