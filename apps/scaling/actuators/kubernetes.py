"""The Kubernetes actuator: the replicas of a pool's worker Deployment (``switchyard-worker-<pool>``
by default) through the official client's scale subresource. Warm replicas are not modelled
here (a Deployment's pods are all routed); draining is the pod's own SIGTERM drain (the worker
supervisor deregisters and finishes in-flight requests within its grace period)."""

from __future__ import annotations

from typing import Any

from apps.models.models import Pool
from apps.scaling.actuators.base import Actuation, ActuatorError, Replicas
from runtime.scaling.controller import Plan


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
        from kubernetes import client, config  # type: ignore[import-untyped]  # noqa: PLC0415

        config.load_kube_config(config_file=path)
        return cls(api=client.AppsV1Api(), **kwargs)

    def _name(self, pool: Pool) -> str:
        return self.deployment.format(pool=pool.name)

    def _apps(self) -> Any:
        if self._api is None:
            raise ActuatorError("no Kubernetes API client (use from_kubeconfig)")
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
