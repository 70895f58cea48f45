"""Real parts for rollout tests: artifact folders that verify, simulator replicas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fixtures.router import Process, spawn, wait_until_up

from runtime.artifacts import compute_manifest

MODEL = "tiny-llama"


def artifact(root: Path, content: bytes = b"weights") -> dict[str, Any]:
    """A local artifact folder: ``model_version_create`` keywords (uri, digest, manifest)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.safetensors").write_bytes(content)
    digest, files = compute_manifest(root)
    manifest = {"tokenizer": "tok", "max_context": 2048, "default_sampling": {}, "files": files}
    return {"artifact_uri": root.as_uri(), "digest": digest, "manifest": manifest}


def start_simulator(*args: str, model: str = MODEL) -> Process:
    process, _ = spawn(
        ["runtime.workers.simulator", "--model", model, "--log-level", "WARNING",
         "--decode-a-ms", "2", *args]
    )  # fmt: skip
    return wait_until_up(process, "/health")
