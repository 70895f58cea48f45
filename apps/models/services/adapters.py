"""The rules of LoRA adapters: a version of a model that names the base version it runs on.

An adapter is an ordinary :class:`~apps.models.models.ModelVersion` of its own model (so it has
its own prices, entitlements, cache switches, routes and rollouts) whose ``base_version`` names
the version whose replicas load it; its artifact is the adapter's weights and config, checked
by digest (and signature) like any artifact. These functions return a field error or ``None``.
"""

from __future__ import annotations

from apps.models.models import Model, ModelVersion

ADAPTER_TASKS = (Model.Task.CHAT, Model.Task.COMPLETION)
ADAPTER_RUNTIMES = (ModelVersion.Runtime.VLLM, ModelVersion.Runtime.SIMULATOR)


def base_version_error(
    *, model: Model, base_version: ModelVersion | None, runtime: str
) -> str | None:
    """Why ``base_version`` cannot carry an adapter version of ``model`` (None: it can)."""
    if base_version is None:
        return None
    base_task = base_version.model.task
    checks = (
        (base_version.model_id == model.pk,
         "An adapter's base version must belong to another model."),
        (base_version.base_version_id is not None,
         f"{base_version} is itself an adapter; name a full model's version."),
        (base_task not in ADAPTER_TASKS,
         f"{base_version} is a {base_task} model; adapters need chat or completion."),
        (model.task != base_task,
         f"Model {model.name!r} is {model.task}, its base {base_version} is {base_task}."),
        (runtime not in ADAPTER_RUNTIMES,
         f"Adapters run on {[str(r) for r in ADAPTER_RUNTIMES]}, not {runtime!r}."),
        (runtime != base_version.runtime,
         f"The adapter's runtime {runtime!r} differs from its base's {base_version.runtime!r}."),
    )  # fmt: skip
    return next((message for failed, message in checks if failed), None)


def base_published_error(version: ModelVersion) -> str | None:
    """An adapter is published only on a published base (what a replica can serve)."""
    base = version.base_version
    if base is not None and not base.is_published:
        return f"Publish the base version {base} first."
    return None
