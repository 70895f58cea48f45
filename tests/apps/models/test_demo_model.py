"""The generated demo model: deterministic bytes, loadable weights, tokenizer, registration."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from apps.common.models import AuditEvent
from apps.models.demo import DemoArtifact, ensure_demo_model, generate_demo_model
from apps.models.models import Model, ModelVersion
from apps.models.services import model_create
from runtime.artifacts import (
    MANIFEST_FILENAME,
    ArtifactMismatchError,
    compute_manifest,
    read_manifest,
    verify_artifact,
)

pytestmark = pytest.mark.db

HF_FILES = {
    "chat_template.jinja",
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
}


@dataclass(frozen=True)
class Generated:
    first: DemoArtifact
    again: DemoArtifact
    other_seed: DemoArtifact


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Generated:
    root = tmp_path_factory.mktemp("demo")
    return Generated(
        first=generate_demo_model(root / "seed0-a", seed=0),
        again=generate_demo_model(root / "seed0-b", seed=0),
        other_seed=generate_demo_model(root / "seed1", seed=1),
    )


@pytest.fixture
def copy_of_seed0(generated: Generated, tmp_path: Path) -> Path:
    return Path(shutil.copytree(generated.first.path, tmp_path / "demo-llama"))


# --- generation ------------------------------------------------------------------------------


@pytest.mark.unit
def test_same_seed_gives_byte_identical_files(generated: Generated) -> None:
    first, again = generated.first, generated.again

    assert first.digest == again.digest
    assert first.files == again.files
    assert set(first.files) == HF_FILES
    for rel in HF_FILES:
        assert (first.path / rel).read_bytes() == (again.path / rel).read_bytes(), rel


@pytest.mark.unit
def test_another_seed_gives_another_model(generated: Generated) -> None:
    first, other = generated.first, generated.other_seed

    assert other.digest != first.digest
    assert other.files["model.safetensors"] != first.files["model.safetensors"]
    assert other.files["tokenizer.json"] != first.files["tokenizer.json"]


@pytest.mark.unit
def test_manifest_matches_the_files(generated: Generated) -> None:
    artifact = generated.first

    assert compute_manifest(artifact.path) == (artifact.digest, artifact.files)
    stored = read_manifest(artifact.path)
    assert stored is not None
    assert stored["digest"] == artifact.digest
    assert stored["files"] == artifact.files
    assert stored["extra"]["seed"] == 0
    manifest = artifact.registry_manifest()
    assert manifest == {
        "tokenizer": str(artifact.path.resolve()),
        "max_context": 2048,
        "default_sampling": {"temperature": 0.7, "top_p": 0.95, "max_tokens": 128},
        "files": artifact.files,
    }
    assert artifact.uri == artifact.path.resolve().as_uri()


@pytest.mark.unit
def test_a_tampered_file_changes_the_digest(copy_of_seed0: Path, generated: Generated) -> None:
    expected = generated.first
    config = copy_of_seed0 / "config.json"
    config.write_text(
        config.read_text().replace('"num_hidden_layers": 2', '"num_hidden_layers": 3')
    )

    assert compute_manifest(copy_of_seed0)[0] != expected.digest
    with pytest.raises(ArtifactMismatchError) as info:
        verify_artifact(copy_of_seed0, expected.digest, expected.files)
    assert info.value.changed == ("config.json",)


@pytest.mark.unit
def test_config_is_the_small_llama_vllm_cpu_accepts(generated: Generated) -> None:
    config = json.loads((generated.first.path / "config.json").read_text())
    generation = json.loads((generated.first.path / "generation_config.json").read_text())

    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["hidden_size"] == 128
    assert config["num_attention_heads"] == config["num_key_value_heads"] == 2
    assert config["head_dim"] == 64  # vLLM's CPU attention rejects head size 16
    assert config["num_hidden_layers"] == 2
    assert config["max_position_embeddings"] == 2048
    assert config["vocab_size"] == generated.first.vocab_size == 512
    assert config["eos_token_id"] == generation["eos_token_id"] == generated.first.eos_token_id
    assert generation["temperature"] == 0.7
    assert generation["top_p"] == 0.95


@pytest.mark.unit
def test_generation_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")

    with pytest.raises(FileExistsError, match="not an empty directory"):
        generate_demo_model(tmp_path)
    assert (tmp_path / "keep.txt").read_text() == "mine"


@pytest.mark.unit
def test_too_small_a_vocabulary_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="vocab_size must be at least 260"):
        generate_demo_model(tmp_path / "m", vocab_size=100)


# --- loading with transformers ---------------------------------------------------------------


@pytest.mark.unit
def test_model_loads_with_transformers_and_generates(generated: Generated) -> None:
    import torch  # noqa: PLC0415 - seconds to import; keep test collection fast
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: PLC0415

    tokenizer = AutoTokenizer.from_pretrained(generated.first.path)
    model: Any = AutoModelForCausalLM.from_pretrained(generated.first.path)
    inputs = tokenizer("The router sends tokens", return_tensors="pt")

    with torch.no_grad():
        output: Any = model.generate(
            **inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False, pad_token_id=3
        )

    assert output.shape == (1, inputs["input_ids"].shape[1] + 4)
    assert isinstance(tokenizer.decode(output[0]), str)


@pytest.mark.unit
def test_tokenizer_round_trips_text(generated: Generated) -> None:
    from transformers import AutoTokenizer  # noqa: PLC0415 - slow import

    tokenizer = AutoTokenizer.from_pretrained(generated.first.path)
    text = "The scheduler routes 42 urgent requests - héllo ✓ 漢字\n\ttabs too!"

    ids = tokenizer(text)["input_ids"]

    assert ids[0] == tokenizer.bos_token_id == 1
    assert tokenizer.eos_token == "</s>"
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    # Trained merges: common corpus words are single tokens, not bytes.
    assert len(tokenizer.tokenize(" the router")) == 2


@pytest.mark.unit
def test_tokenizer_applies_the_chat_template(generated: Generated) -> None:
    from transformers import AutoTokenizer  # noqa: PLC0415 - slow import

    tokenizer = AutoTokenizer.from_pretrained(generated.first.path)
    conversation: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "Hi."},
        {"role": "user", "content": [{"type": "text", "text": "how many trains?"}]},
    ]

    prompt = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    ids = tokenizer.apply_chat_template(
        conversation[:2], tokenize=True, add_generation_prompt=True, return_dict=False
    )

    assert prompt == (
        "<s>system: Be brief.\nuser: hello\nassistant: Hi.</s>\nuser: how many trains?\nassistant:"
    )
    assert ids[0] == tokenizer.bos_token_id
    assert ids.count(tokenizer.bos_token_id) == 1


# --- ensure (generate unless present) --------------------------------------------------------


@pytest.mark.unit
def test_ensure_keeps_an_intact_model(copy_of_seed0: Path, generated: Generated) -> None:
    mtime = (copy_of_seed0 / "model.safetensors").stat().st_mtime_ns

    artifact, made = ensure_demo_model(copy_of_seed0, seed=0)

    assert made is False
    assert artifact.digest == generated.first.digest
    assert (copy_of_seed0 / "model.safetensors").stat().st_mtime_ns == mtime


@pytest.mark.unit
def test_ensure_regenerates_a_damaged_or_other_seed_model(
    copy_of_seed0: Path, generated: Generated
) -> None:
    (copy_of_seed0 / "tokenizer.json").write_text("{}")

    artifact, made = ensure_demo_model(copy_of_seed0, seed=0)

    assert made is True
    assert artifact.digest == generated.first.digest
    assert compute_manifest(copy_of_seed0)[0] == generated.first.digest

    artifact, made = ensure_demo_model(copy_of_seed0, seed=1)
    assert made is True
    assert artifact.digest == generated.other_seed.digest
    assert not [p for p in copy_of_seed0.parent.iterdir() if p.name.startswith(".demo-llama.")]


@pytest.mark.unit
def test_ensure_refuses_a_folder_that_is_not_a_demo_model(tmp_path: Path) -> None:
    (tmp_path / "precious.txt").write_text("keep")

    with pytest.raises(FileExistsError, match=f"holds no {MANIFEST_FILENAME}"):
        ensure_demo_model(tmp_path)
    assert (tmp_path / "precious.txt").read_text() == "keep"


# --- the management command ------------------------------------------------------------------


def _run(*args: str) -> str:
    out = StringIO()
    call_command("make_demo_model", *args, stdout=out)
    return out.getvalue()


@pytest.mark.db
@pytest.mark.django_db
def test_command_registers_one_published_version_idempotently(
    copy_of_seed0: Path, generated: Generated
) -> None:
    first = _run("--out", str(copy_of_seed0))

    version = ModelVersion.objects.select_related("model").get()
    assert version.model.name == "demo-llama"
    assert version.model.task == Model.Task.CHAT
    assert version.label == "v1"
    assert version.is_published
    assert version.digest == generated.first.digest
    assert version.artifact_uri == copy_of_seed0.resolve().as_uri()
    assert version.runtime == ModelVersion.Runtime.VLLM
    assert version.memory_gb == 0.5
    assert version.manifest["files"] == generated.first.files
    assert version.manifest["max_context"] == 2048
    assert "already up to date" in first
    assert "registered demo-llama:v1" in first
    assert "published demo-llama:v1" in first
    assert "signed demo-llama:v1 with the demo key demo-" in first
    events = AuditEvent.objects.count()

    again = json.loads(_run("--out", str(copy_of_seed0), "--json"))

    assert ModelVersion.objects.count() == 1
    assert AuditEvent.objects.count() == events
    assert again == {
        "path": str(copy_of_seed0.resolve()),
        "artifact_uri": version.artifact_uri,
        "digest": generated.first.digest,
        "generated": False,
        "model": "demo-llama",
        "label": "v1",
        "version_id": version.pk,
        "version_created": False,
        "published": True,
        "signed_now": False,  # signed by the first run, with the demo key
    }


@pytest.mark.db
@pytest.mark.django_db
def test_command_no_publish_leaves_a_draft_then_publish_publishes_it(
    copy_of_seed0: Path,
) -> None:
    output = _run("--out", str(copy_of_seed0), "--no-publish", "--label", "draft-1")
    version = ModelVersion.objects.get(label="draft-1")
    assert not version.is_published
    assert "is a draft" in output

    output = _run("--out", str(copy_of_seed0), "--label", "draft-1")

    version.refresh_from_db()
    assert version.is_published
    assert "already registered" in output
    assert ModelVersion.objects.count() == 1


@pytest.mark.db
@pytest.mark.django_db
def test_command_refuses_a_taken_label_for_another_artifact(
    copy_of_seed0: Path, generated: Generated, tmp_path: Path
) -> None:
    _run("--out", str(copy_of_seed0))
    other = Path(shutil.copytree(generated.other_seed.path, tmp_path / "seed1"))

    with pytest.raises(CommandError, match="already registered with digest"):
        _run("--out", str(other), "--seed", "1", "--label", "v1")
    moved = Path(shutil.copytree(copy_of_seed0, tmp_path / "moved"))
    with pytest.raises(CommandError, match="already registered at"):
        _run("--out", str(moved))

    _run("--out", str(other), "--seed", "1", "--label", "v2")
    assert sorted(ModelVersion.objects.values_list("label", flat=True)) == ["v1", "v2"]


@pytest.mark.db
@pytest.mark.django_db
def test_command_refuses_a_non_chat_model_of_that_name(copy_of_seed0: Path) -> None:
    model_create(actor=None, name="demo-llama", task=Model.Task.EMBEDDING)

    with pytest.raises(CommandError, match="not a chat model"):
        _run("--out", str(copy_of_seed0))
    assert not ModelVersion.objects.exists()


@pytest.mark.db
@pytest.mark.django_db
def test_command_refuses_an_invalid_label(copy_of_seed0: Path) -> None:
    with pytest.raises(CommandError, match="label: Label must be"):
        _run("--out", str(copy_of_seed0), "--label", "not a label!")
    assert not Model.objects.exists()


@pytest.mark.db
@pytest.mark.django_db
def test_command_refuses_to_overwrite_a_foreign_folder(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep")

    with pytest.raises(CommandError, match="could not generate the demo model"):
        _run("--out", str(tmp_path))
    assert (tmp_path / "notes.txt").read_text() == "keep"
    assert not Model.objects.exists()
