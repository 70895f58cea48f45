"""platform/k8s: every manifest validates (strict) against the Kubernetes schemas offline, and
the deployment has what running on many machines needs: probes, PDBs, requests, one beat,
securityContext everywhere, an API token and least-privilege RBAC for the worker only, the
router's preStop drain."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

pytestmark = pytest.mark.unit

K8S = Path(__file__).resolve().parents[2] / "platform" / "k8s"
KUBERNETES_VERSION = "1.37.0"
MANIFESTS = sorted(path for path in K8S.glob("*.yaml") if path.name != "kustomization.yaml")


def documents(path: Path) -> Iterator[dict[str, Any]]:
    for document in yaml.safe_load_all(path.read_text()):
        if document:
            yield document


def resources() -> list[dict[str, Any]]:
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    return [document for name in listed for document in documents(K8S / name)]


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {r["metadata"]["name"]: r for r in resources() if r["kind"] == kind}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(key) == value for key, value in selector.items())


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda path: path.name)
def test_manifest_validates_strictly(path: Path) -> None:
    for document in documents(path):
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)


def test_strict_validation_rejects_a_typo() -> None:
    router = by_kind("Deployment")["switchyard-router"]
    broken = yaml.safe_load(yaml.safe_dump(router))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGett"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_kustomization_lists_every_manifest_but_the_secret_example() -> None:
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    assert listed == {path.name for path in MANIFESTS} - {"secret.example.yaml"}


def test_routers_behind_a_service_with_probes_on_readyz_and_healthz() -> None:
    router = by_kind("Deployment")["switchyard-router"]
    assert router["spec"]["replicas"] >= 3
    pod = router["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    assert container["command"][:3] == ["python", "-m", "runtime.gateway"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    service = by_kind("Service")["switchyard-router"]
    assert matches(service["spec"]["selector"], pod["metadata"]["labels"])


def test_every_deployment_requests_resources_and_uses_the_shared_settings() -> None:
    for name, deployment in by_kind("Deployment").items():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            requests = container["resources"]["requests"]
            assert {"cpu", "memory"} <= set(requests), name
            sources = {next(iter(ref.values()))["name"] for ref in container["envFrom"]}
            assert sources == {"switchyard-config", "switchyard-secrets"}, name


def test_replicated_deployments_have_a_disruption_budget() -> None:
    budgets = list(by_kind("PodDisruptionBudget").values())
    for name, deployment in by_kind("Deployment").items():
        if deployment["spec"]["replicas"] < 2:
            continue
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert any(matches(b["spec"]["selector"]["matchLabels"], labels) for b in budgets), name


def test_the_celery_beat_deployment_ships_one_replica_recreated() -> None:
    """One beat by default (more may run: the Redis lease holder schedules, config/beat_lock.py)."""
    beat = by_kind("Deployment")["switchyard-celery-beat"]
    assert beat["spec"]["replicas"] == 1
    assert beat["spec"]["strategy"]["type"] == "Recreate"
    (container,) = beat["spec"]["template"]["spec"]["containers"]
    assert container["command"][:4] == ["celery", "-A", "config", "beat"]


def test_web_pods_serve_the_static_files_collected_into_the_image() -> None:
    """DEBUG=false: WhiteNoise serves STATIC_ROOT only. The image collects the static files at
    build time into SWITCHYARD_STATIC_ROOT on its (read-only) root; no pod collects them."""
    containerfile = (K8S.parent / "image" / "Containerfile").read_text()
    assert "SWITCHYARD_STATIC_ROOT=/usr/share/switchyard/static" in containerfile
    assert "collectstatic --noinput" in containerfile
    pod = by_kind("Deployment")["switchyard-web"]["spec"]["template"]["spec"]
    assert not pod.get("initContainers")
    (web,) = pod["containers"]
    assert web["securityContext"]["readOnlyRootFilesystem"] is True


def test_management_commands_run_without_a_manage_py() -> None:
    """The image installs the wheel: ``python -m config.manage``, never ``manage.py``."""
    for resource in resources():
        spec = resource.get("spec", {}).get("template", {}).get("spec", {})
        for container in [*spec.get("containers", []), *spec.get("initContainers", [])]:
            assert "manage.py" not in " ".join(container.get("command", [])), container["name"]


def pods() -> dict[str, dict[str, Any]]:
    """Every pod template (Deployments and the migrate Job), by its owner's name."""
    return {
        r["metadata"]["name"]: r["spec"]["template"]["spec"]
        for r in resources()
        if "template" in r.get("spec", {})
    }


# Where the root filesystem stays writable, and why (the caches vLLM/torch/Triton write).
WRITABLE_ROOT = {"switchyard-worker-gpu"}


def test_every_pod_and_container_runs_unprivileged_as_a_numeric_non_root_user() -> None:
    assert len(pods()) >= 6
    for name, pod in pods().items():
        context = pod["securityContext"]
        assert context["runAsNonRoot"] is True, name
        assert isinstance(context["runAsUser"], int), name
        assert context["runAsUser"] > 0, name
        mounts_by_volume = {v["name"] for v in pod.get("volumes", []) if "emptyDir" in v}
        for container in [*pod["containers"], *pod.get("initContainers", [])]:
            own = container["securityContext"]
            assert own["allowPrivilegeEscalation"] is False, (name, container["name"])
            assert own["capabilities"]["drop"] == ["ALL"], (name, container["name"])
            assert "add" not in own["capabilities"], (name, container["name"])
            assert own["readOnlyRootFilesystem"] is (name not in WRITABLE_ROOT), name
            mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts", [])}
            assert mounts.get("/tmp") in mounts_by_volume, (name, container["name"])
            assert mounts.get("/var/lib/switchyard") in mounts_by_volume, (name, container["name"])


def test_only_the_celery_worker_gets_an_api_token() -> None:
    with_token = {
        name: pod.get("serviceAccountName")
        for name, pod in pods().items()
        if pod.get("automountServiceAccountToken") is not False
    }
    assert with_token == {"switchyard-celery-worker": "switchyard-celery-worker"}
    (account,) = by_kind("ServiceAccount").values()
    assert account["metadata"]["name"] == "switchyard-celery-worker"


def test_the_autoscaler_role_grants_exactly_the_scale_verbs() -> None:
    (role,) = by_kind("Role").values()
    assert not by_kind("ClusterRole")
    assert not by_kind("ClusterRoleBinding")
    rules = {
        (group, resource): sorted(rule["verbs"])
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert rules == {
        ("apps", "deployments/scale"): ["get", "patch", "update"],
        ("apps", "deployments"): ["get", "list"],
    }
    assert all("resourceNames" not in rule for rule in role["rules"])
    (binding,) = by_kind("RoleBinding").values()
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "switchyard-celery-worker", "namespace": "switchyard"}
    ]


def test_the_router_drains_before_sigterm_within_its_grace_period() -> None:
    """preStop keeps the pod serving while its endpoints drop; SIGTERM then starts the router's
    own grace (--graceful-shutdown-s); Kubernetes kills at terminationGracePeriodSeconds, counted
    from the start of preStop, so it must cover both."""
    from runtime.gateway.__main__ import build_parser  # noqa: PLC0415

    pod = pods()["switchyard-router"]
    (container,) = pod["containers"]
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert pre_stop >= 5
    args = build_parser().parse_args(container["command"][3:])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + args.graceful_shutdown_s


def test_web_probes_ask_django_with_an_allowed_host() -> None:
    from django.urls import resolve  # noqa: PLC0415

    (web,) = pods()["switchyard-web"]["containers"]
    allowed = by_kind("ConfigMap")["switchyard-config"]["data"]["ALLOWED_HOSTS"].split(",")
    for probe in (web["readinessProbe"], web["livenessProbe"]):
        get = probe["httpGet"]
        resolve(get["path"])  # a real URL of config/urls.py
        headers = {h["name"]: h["value"] for h in get["httpHeaders"]}
        assert headers["Host"] in allowed
