"""The Kubernetes actuator: against a real API server when KUBECONFIG is set; the worker
Deployment manifest checked offline always."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from runtime.scaling.controller import Plan

pytestmark = pytest.mark.integration

MANIFEST = Path(__file__).resolve().parents[3] / "platform/k8s/worker-pool-gpu.yaml"
SIM_MANIFEST = Path(__file__).resolve().parent / "manifests/sim-worker-deployment.yaml"


def test_worker_deployment_manifest_is_what_the_actuator_scales() -> None:
    doc = next(yaml.safe_load_all(MANIFEST.read_text()))
    assert (doc["apiVersion"], doc["kind"]) == ("apps/v1", "Deployment")
    pool = doc["metadata"]["labels"]["switchyard.io/pool"]
    assert doc["metadata"]["name"] == f"switchyard-worker-{pool}"  # the actuator's default name
    spec = doc["spec"]
    assert spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items()
    (container,) = spec["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    assert spec["template"]["spec"]["terminationGracePeriodSeconds"] >= 30  # room to drain


@pytest.mark.integration
@pytest.mark.skipif(not os.environ.get("KUBECONFIG"), reason="KUBECONFIG is not set: no API server")
@pytest.mark.django_db
def test_scales_the_pool_deployment_on_a_real_api_server() -> None:  # pragma: no cover - cluster
    from kubernetes import client, config  # noqa: PLC0415

    from apps.models.models import Pool  # noqa: PLC0415
    from apps.scaling.actuators.kubernetes import KubernetesActuator  # noqa: PLC0415

    config.load_kube_config()
    namespace = os.environ.get("SWITCHYARD_K8S_NAMESPACE", "default")
    doc: dict[str, Any] = yaml.safe_load(SIM_MANIFEST.read_text())
    doc["metadata"]["namespace"] = namespace
    apps = client.AppsV1Api()
    apps.create_namespaced_deployment(namespace, doc)
    try:
        actuator = KubernetesActuator(namespace=namespace, api=apps)
        pool = Pool(name="sim-pool", hardware_tier="cpu")
        assert actuator.observe(pool).serving == 1
        done = actuator.apply(pool, Plan("out", 1, 3, "test"))
        assert not done.error
        assert done.started == 2
        assert actuator.observe(pool).serving == 3
    finally:
        apps.delete_namespaced_deployment(doc["metadata"]["name"], namespace)
