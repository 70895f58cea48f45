"""Offline, cheap (runs in CI): the Kubernetes manifests run only roles the image has
(``platform/image/roles``), each pod the image variant its role needs, and the GPU pool's
weights come read-only from the volume its claim names. That every role starts inside the built
image is tests/packaging/test_image.py (``platform/image/build --smoke``)."""

from __future__ import annotations

import pytest
import yaml
from fixtures.image_roles import K8S, argv_of, containers, role_of, roles

pytestmark = pytest.mark.unit


def test_the_image_declares_every_role_of_the_issue() -> None:
    assert set(roles()) >= {
        "web", "router", "celery-worker", "celery-beat", "model-worker", "encoder-worker",
    }  # fmt: skip


def test_the_manifests_name_only_roles_the_image_has() -> None:
    found = {name: role_of(argv_of(c["command"])) for name, c in containers()}
    assert None not in found.values(), found
    assert set(found.values()) >= {"web", "router", "celery-worker", "celery-beat", "migrate"}
    assert found["switchyard-worker-gpu"] == "model-worker"


def test_a_command_of_no_role_is_caught() -> None:
    assert role_of(argv_of(["python", "-m", "runtime.nothing"])) is None
    assert role_of(argv_of(["sh", "-c", "exec celery -A config beat -l info"])) == "celery-beat"


def test_pods_run_the_image_variant_their_role_needs() -> None:
    images = {name: c["image"] for name, c in containers()}
    assert images.pop("switchyard-worker-gpu") == "switchyard:gpu"
    assert set(images.values()) == {"switchyard:cpu"}, images


def test_the_gpu_pool_reads_its_weights_read_only_from_a_claim() -> None:
    docs = [d for d in yaml.safe_load_all((K8S / "worker-pool-gpu.yaml").read_text()) if d]
    (pool,) = [d for d in docs if d["kind"] == "Deployment"]
    claims = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PersistentVolumeClaim"}
    pod = pool["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "persistentVolumeClaim" in v]
    claim = volume["persistentVolumeClaim"]
    assert claim["readOnly"] is True
    assert "ReadOnlyMany" in claims[claim["claimName"]]["spec"]["accessModes"]
    (mount,) = [m for m in pod["containers"][0]["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True
    assert mount["mountPath"].startswith("/models/")
