"""A demo LoRA adapter for the demo model, made locally from a seed with ``peft``.

``generate_demo_adapter`` writes a PEFT adapter folder (``adapter_config.json``,
``adapter_model.safetensors``) for the demo Llama in ``base_dir``, plus
``switchyard-manifest.json`` (:mod:`runtime.artifacts`). The LoRA ``B`` matrices, which PEFT
initialises to zero, are drawn from a seeded normal distribution instead, so the adapter really
changes the base model's output (an all-zero adapter would be indistinguishable from the base).
Nothing reaches a model hub: ``base_model_name_or_path`` names the local base folder.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from apps.models.demo import _offline, replace_generated
from runtime.artifacts import compute_manifest, read_manifest, write_manifest

GENERATOR = "switchyard-demo-lora"
GENERATOR_FORMAT = 1
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclass(frozen=True, kw_only=True)
class AdapterSpec:
    """Everything the adapter's bytes depend on (besides the base and library versions)."""

    seed: int = 0
    rank: int = 8
    alpha: int = 16
    b_std: float = 0.5  # the seeded LoRA B weights' standard deviation: output visibly differs
    base_digest: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {"generator": GENERATOR, "format": GENERATOR_FORMAT, **asdict(self)}


@dataclass(frozen=True, kw_only=True)
class AdapterArtifact:
    """A generated adapter folder and its manifest."""

    path: Path
    spec: AdapterSpec
    digest: str
    files: dict[str, str] = field(repr=False)

    @property
    def uri(self) -> str:
        return self.path.resolve().as_uri()

    def registry_manifest(self) -> dict[str, Any]:
        """The adapter version's ``manifest`` (the registry's keys)."""
        return {"files": dict(self.files), "lora_rank": self.spec.rank}


def generate_demo_adapter(out_dir: Path, *, base_dir: Path, spec: AdapterSpec) -> AdapterArtifact:
    """Write the adapter for ``spec`` on the model in ``base_dir`` into ``out_dir`` (which must
    be absent or empty)."""
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise FileExistsError(f"{out_dir} exists and is not an empty directory")
    _offline()
    import torch  # noqa: PLC0415 - heavy imports, only when generating
    from peft import LoraConfig, get_peft_model  # noqa: PLC0415
    from transformers import LlamaForCausalLM  # noqa: PLC0415

    base = LlamaForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    config = LoraConfig(
        r=spec.rank,
        lora_alpha=spec.alpha,
        target_modules=list(TARGET_MODULES),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        peft_model = get_peft_model(base, config)
        with torch.no_grad():
            for name, param in peft_model.named_parameters():
                if "lora_" in name:
                    param.normal_(0.0, spec.b_std if "lora_B" in name else 0.1)
    out_dir.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out_dir), safe_serialization=True)
    config_path = out_dir / "adapter_config.json"
    document = json.loads(config_path.read_text(encoding="utf-8"))
    document["base_model_name_or_path"] = str(Path(base_dir).resolve())
    config_path.write_text(json.dumps(document, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    readme = out_dir / "README.md"  # peft's model card template: not part of the artifact
    readme.unlink(missing_ok=True)
    for path in out_dir.iterdir():
        path.chmod(0o644)
    digest, files = write_manifest(out_dir, extra=spec.as_dict())
    return AdapterArtifact(path=out_dir, spec=spec, digest=digest, files=files)


def load_demo_adapter(out_dir: Path, *, spec: AdapterSpec) -> AdapterArtifact | None:
    """The adapter already in ``out_dir`` if it was made from ``spec`` and is intact."""
    stored = read_manifest(Path(out_dir))
    if stored is None or stored.get("extra") != spec.as_dict():
        return None
    digest, files = compute_manifest(Path(out_dir))
    if digest != stored["digest"]:
        return None
    return AdapterArtifact(path=Path(out_dir), spec=spec, digest=digest, files=files)


def ensure_demo_adapter(
    out_dir: Path, *, base_dir: Path, spec: AdapterSpec
) -> tuple[AdapterArtifact, bool]:
    """The adapter for ``spec`` in ``out_dir``, generated unless an intact one is there."""
    out_dir = Path(out_dir)
    existing = load_demo_adapter(out_dir, spec=spec) if out_dir.is_dir() else None
    if existing is not None:
        return existing, False
    replace_generated(
        out_dir, lambda staged: generate_demo_adapter(staged, base_dir=base_dir, spec=spec)
    )
    artifact = load_demo_adapter(out_dir, spec=spec)
    if artifact is None:  # pragma: no cover - we just wrote it
        raise RuntimeError(f"generated demo adapter in {out_dir} does not verify")
    return artifact, True
