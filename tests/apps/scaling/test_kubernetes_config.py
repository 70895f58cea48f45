"""The Kubernetes actuator's configuration: in-cluster (a service-account dir) first, a
kubeconfig file otherwise, and an error naming both when neither works. The kubernetes
client's own loaders read real files here; no API server is contacted."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from apps.scaling.actuators.base import ActuatorError
from apps.scaling.actuators.kubernetes import KubernetesActuator

pytestmark = pytest.mark.unit

CLUSTER_ENV = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "443"}


def service_account(tmp_path: Path) -> Path:
    directory = tmp_path / "serviceaccount"
    directory.mkdir()
    (directory / "token").write_text("in-cluster-token")
    (directory / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n")
    return directory


def kubeconfig(tmp_path: Path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://kube.example:6443"}}],
                "users": [{"name": "u", "user": {"token": "kubeconfig-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    return path


def configuration(actuator: KubernetesActuator) -> object:
    return actuator._apps().api_client.configuration


def test_in_cluster_config_comes_first(tmp_path: Path) -> None:
    actuator = KubernetesActuator.from_cluster(
        str(kubeconfig(tmp_path)),
        service_account_dir=service_account(tmp_path),
        environ=CLUSTER_ENV,
        namespace="ns",
    )
    config = configuration(actuator)
    assert config.host == "https://10.0.0.1:443"  # type: ignore[attr-defined]
    assert config.api_key == {"authorization": "bearer in-cluster-token"}  # type: ignore[attr-defined]
    assert actuator.namespace == "ns"


def test_falls_back_to_the_kubeconfig_outside_a_cluster(tmp_path: Path) -> None:
    actuator = KubernetesActuator.from_cluster(
        str(kubeconfig(tmp_path)), service_account_dir=tmp_path / "absent", environ={}
    )
    config = configuration(actuator)
    assert config.host == "https://kube.example:6443"  # type: ignore[attr-defined]
    assert config.api_key == {"authorization": "Bearer kubeconfig-token"}  # type: ignore[attr-defined]


def test_neither_names_both_in_the_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-kubeconfig"
    with pytest.raises(ActuatorError) as raised:
        KubernetesActuator.from_cluster(
            str(missing), service_account_dir=tmp_path / "absent", environ={}
        )
    message = str(raised.value)
    assert "in-cluster" in message
    assert "kubeconfig" in message
    assert str(tmp_path / "absent") in message
    assert str(missing) in message
