"""The Kubernetes actuator: the replicas of a pool's worker Deployment (``switchyard-worker-<pool>``
by default) through the official client's scale subresource. Warm replicas are not modelled
here (a Deployment's pods are all routed); draining is the pod's own SIGTERM drain (the worker
supervisor deregisters and finishes in-flight requests within its grace period)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from apps.models.models import Pool
from apps.scaling.actuators.base import Actuation, ActuatorError, Replicas
from runtime.scaling.controller import Plan

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")


class KubernetesActuator:
    name = "kubernetes"

    def __init__(
        self,
        *,
        namespace: str = "switchyard",
        deployment: str = "switchyard-worker-{pool}",
        api: Any | None = None,
    ) -> None:
        self.namespace = namespace
        self.deployment = deployment
        self._api = api

    @classmethod
    def from_kubeconfig(cls, path: str | None = None, **kwargs: Any) -> KubernetesActuator:
        """From a kubeconfig file only (``path``, else ``$KUBECONFIG`` / ``~/.kube/config``)."""
        from kubernetes import client, config  # type: ignore[import-untyped]  # noqa: PLC0415

        configuration = client.Configuration()
        config.load_kube_config(config_file=path, client_configuration=configuration)
        return cls(api=client.AppsV1Api(client.ApiClient(configuration)), **kwargs)

    @classmethod
    def from_cluster(
        cls,
        kubeconfig: str | None = None,
        *,
        service_account_dir: Path = SERVICE_ACCOUNT_DIR,
        environ: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> KubernetesActuator:
        """In-cluster config first (the pod's ServiceAccount token and CA under
        ``service_account_dir`` and ``KUBERNETES_SERVICE_HOST``/``_PORT``), else a kubeconfig
        (``kubeconfig``, else ``$KUBECONFIG`` / ``~/.kube/config``). The client configuration is
        this actuator's own (the client's process-wide default is left alone)."""
        from kubernetes import client, config  # noqa: PLC0415
        from kubernetes.config.incluster_config import (  # type: ignore[import-untyped]  # noqa: PLC0415
            InClusterConfigLoader,
        )

        configuration = client.Configuration()
        try:
            InClusterConfigLoader(
                token_filename=str(service_account_dir / "token"),
                cert_filename=str(service_account_dir / "ca.crt"),
                environ=os.environ if environ is None else environ,
            ).load_and_set(configuration)
        except config.ConfigException as in_cluster:
            try:
                config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
            except (config.ConfigException, OSError) as kube:
                raise ActuatorError(
                    "no Kubernetes configuration: in-cluster config failed "
                    f"({in_cluster}; service account {service_account_dir}) and kubeconfig "
                    f"failed ({kube}; {kubeconfig or '$KUBECONFIG or ~/.kube/config'})"
                ) from kube
        return cls(api=client.AppsV1Api(client.ApiClient(configuration)), **kwargs)

    def _name(self, pool: Pool) -> str:
        return self.deployment.format(pool=pool.name)

    def _apps(self) -> Any:
        if self._api is None:
            raise ActuatorError("no Kubernetes API client (use from_cluster)")
        return self._api

    def observe(self, pool: Pool) -> Replicas:
        try:
            scale = self._apps().read_namespaced_deployment_scale(self._name(pool), self.namespace)
        except Exception as exc:
            raise ActuatorError(f"reading {self.namespace}/{self._name(pool)}: {exc}") from exc
        return Replicas(serving=int(scale.spec.replicas or 0))

    def apply(self, pool: Pool, plan: Plan) -> Actuation:
        if plan.desired == plan.current:
            return Actuation()
        body = {"spec": {"replicas": plan.desired}}
        try:
            self._apps().patch_namespaced_deployment_scale(self._name(pool), self.namespace, body)
        except Exception as exc:
            return Actuation(error=f"scaling {self.namespace}/{self._name(pool)}: {exc}")
        delta = plan.desired - plan.current
        return Actuation(started=max(delta, 0), stopped=max(-delta, 0))
