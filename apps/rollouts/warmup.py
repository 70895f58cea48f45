"""Warm-up of a rollout's candidate before it takes traffic, and its drain after a rollback.

:func:`rollout_warm_up` (the ``rollout_start`` task calls it after ``start``), bounded by
``settings.ROLLOUT_WARMUP_TIMEOUT_S``:

1. the candidate's artifact is verified against the registry's digest
   (:func:`runtime.artifacts.verify_artifact`) when it is a ``file://`` folder on this host; a
   remote artifact, or a folder only the model hosts have, is verified by the worker that loads
   it (``serve_model``), and the event says so;
2. the candidate gets a replica: its ready endpoints, or, when it has none, one replica started
   by the configured scaling actuator (``apps.scaling.tasks.actuator_from_env``) in the pool
   that serves the stable version, *warm* (registered ``starting``, not routed); its endpoint id
   is kept in ``Rollout.warmup_endpoints``;
3. warm-up requests over representative shapes go straight to each replica (chat/completion: a
   short unary and a long streamed prompt; embeddings: a short and a long input) and their
   answers are checked, then ``/health``;
4. the started endpoint is set ``ready`` through the registry service, and the rollout enters
   ``running`` at step 0 (:func:`apps.rollouts.transitions.rollout_warmed`).

Any failure aborts the rollout with the reason (and drains what the warm-up started).
:func:`apps.rollouts.drain.candidate_drain` drains the replicas the warm-up started after a
rollback or an abort: ``draining``, then stopped by the actuator (``drain``); the stable
version is never touched.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError

from apps.models.models import Endpoint, Model, ModelVersion, Pool
from apps.models.services.fleet import endpoint_set_state
from apps.rollouts.drain import candidate_drain
from apps.rollouts.models import Rollout
from apps.rollouts.transitions import rollout_abort, rollout_warmed
from apps.scaling.actuators.base import ActuatorError
from apps.scaling.tasks import actuator_from_env
from runtime.artifacts import ArtifactError, verify_artifact
from runtime.tls import upstream_context

LONG_PROMPT = " ".join(["The quick brown fox jumps over the lazy dog."] * 40)  # ~400 tokens
SHORT_PROMPT = "Say hello."


class WarmupError(Exception):
    """Why the candidate cannot take traffic (the abort's reason)."""


@dataclass(slots=True)
class Warmup:
    """What the warm-up did (recorded in the ``warmed`` or ``abort`` event)."""

    deadline: float
    artifact: str = ""
    started: list[int] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)

    def remaining(self) -> float:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise WarmupError("the warm-up ran out of time (ROLLOUT_WARMUP_TIMEOUT_S)")
        return left

    def as_dict(self) -> dict[str, Any]:
        return {"artifact": self.artifact, "started": self.started, "checks": self.checks}


def artifact_check(version: ModelVersion) -> str:
    """Verify a local artifact against the version's digest; what was checked."""
    parts = urlsplit(version.artifact_uri)
    if parts.scheme != "file":
        return f"{version.artifact_uri}: remote artifact, verified by the worker that loads it"
    root = Path(unquote(parts.path))
    if not root.is_dir():  # the model hosts' disk, not this one's: the worker checks it there
        return f"{root}: not on this host; the worker that loads it verifies the digest"
    files = version.manifest.get("files") if isinstance(version.manifest, dict) else None
    try:
        verify_artifact(root, version.digest, files if isinstance(files, dict) else None)
    except (ArtifactError, OSError) as exc:
        raise WarmupError(f"the artifact of {version} does not verify: {exc}") from exc
    return f"{root}: digest {version.digest} verified"


def _pool(rollout: Rollout) -> Pool:
    for version in (rollout.candidate_version, rollout.stable_version):
        endpoint = (
            Endpoint.objects.select_related("pool")
            .filter(version=version)
            .exclude(state=Endpoint.State.GONE)
            .order_by("-id")
            .first()
        )
        if endpoint is not None:
            return endpoint.pool
    raise WarmupError(
        f"no pool to start {rollout.candidate_version.label} in: neither version has an endpoint"
    )


def _replicas(rollout: Rollout, warmup: Warmup) -> list[Endpoint]:
    """The candidate's ready endpoints, or one warm replica started by the actuator."""
    ready = list(
        Endpoint.objects.filter(
            version=rollout.candidate_version, state=Endpoint.State.READY
        ).order_by("id")
    )
    if ready:
        return ready
    actuator = actuator_from_env()
    start = getattr(actuator, "start", None)
    if start is None:
        raise WarmupError(
            f"the candidate {rollout.candidate_version.label} has no ready endpoint and no "
            "configured scaling actuator can start one (SWITCHYARD_SCALING_ACTUATOR=local)"
        )
    pool = _pool(rollout)
    warmup.remaining()
    try:
        endpoint, took = start(pool, routed=False, version=rollout.candidate_version)
    except ActuatorError as exc:
        raise WarmupError(f"the actuator could not start a replica: {exc}") from exc
    warmup.started.append(endpoint.pk)
    Rollout.objects.filter(pk=rollout.pk).update(warmup_endpoints=list(warmup.started))
    warmup.checks.append({"check": "replica started", "endpoint": endpoint.pk, "s": took.seconds})
    return [endpoint]


def _http(url: str, body: dict[str, Any] | None, *, timeout: float) -> tuple[int, bytes]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(  # noqa: S310 (the registry's endpoint URL)
        url, data=data, headers={"Content-Type": "application/json"}
    )
    try:
        # An https replica (`up --tls`): the CA and client certificate the router uses (mTLS).
        context = upstream_context(os.environ) if url.startswith("https:") else None
        with urllib.request.urlopen(request, timeout=timeout, context=context) as resp:  # noqa: S310
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
    except (OSError, ValueError) as exc:
        raise WarmupError(f"{url}: {exc}") from exc


def _shapes(model: Model) -> list[tuple[str, str, dict[str, Any]]]:
    """(name, path, body) of the warm-up requests for the model's task."""
    name = model.name
    if model.task == Model.Task.EMBEDDING:
        return [
            ("embedding short", "/v1/embeddings", {"model": name, "input": SHORT_PROMPT}),
            ("embedding long", "/v1/embeddings", {"model": name, "input": LONG_PROMPT}),
        ]
    if model.task == Model.Task.CHAT:
        path = "/v1/chat/completions"

        def body(text: str) -> dict[str, Any]:
            return {"model": name, "messages": [{"role": "user", "content": text}]}
    elif model.task == Model.Task.COMPLETION:
        path = "/v1/completions"

        def body(text: str) -> dict[str, Any]:
            return {"model": name, "prompt": text}
    else:
        return []  # classification: the health check only
    return [
        ("short unary", path, {**body(SHORT_PROMPT), "max_tokens": 4, "temperature": 0.0}),
        ("long streamed", path, {**body(LONG_PROMPT), "max_tokens": 8, "stream": True}),
    ]


def _stream_error(raw: bytes) -> str | None:
    text = raw.decode(errors="replace")
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    if not events or events[-1].strip() != "[DONE]":
        return "the stream did not end with [DONE]"
    chunks = [json.loads(event) for event in events[:-1]]
    if not any(chunk.get("choices") for chunk in chunks) or any("error" in c for c in chunks):
        return "the stream carried no choice, or an error"
    return None


def _answer_error(name: str, body: dict[str, Any], status: int, raw: bytes) -> str | None:
    """What is wrong with an answer, or None."""
    if status != 200:
        return f"HTTP {status}: {raw[:300].decode(errors='replace')}"
    if body.get("stream"):
        return _stream_error(raw)
    try:
        document = json.loads(raw)
    except ValueError:
        return "the answer is not JSON"
    if name.startswith("embedding"):
        data = document.get("data") or [{}]
        return None if data[0].get("embedding") else "the answer has no embedding"
    choices = document.get("choices") or []
    return None if choices and "usage" in document else "the answer has no choice or usage"


def _call(warmup: Warmup, url: str, body: dict[str, Any] | None, cap: float) -> tuple[int, bytes]:
    """One warm-up request bounded by what is left of the warm-up (at most ``cap`` seconds).
    A request that failed once the warm-up's time was up (a replica that started in time but
    could not answer before the deadline) aborts with the timeout's own reason, not the
    request's."""
    try:
        return _http(url, body, timeout=min(warmup.remaining(), cap))
    except WarmupError:
        warmup.remaining()
        raise


def _warm(endpoint: Endpoint, model: Model, warmup: Warmup) -> None:
    for name, path, body in _shapes(model):
        started = time.monotonic()
        status, raw = _call(warmup, f"{endpoint.base_url}{path}", body, 60.0)
        problem = _answer_error(name, body, status, raw)
        if problem is not None:
            raise WarmupError(f"warm-up request {name!r} to {endpoint.base_url}: {problem}")
        warmup.checks.append(
            {"check": name, "endpoint": endpoint.pk, "ms": (time.monotonic() - started) * 1000}
        )
    status, raw = _call(warmup, f"{endpoint.base_url}/health", None, 5.0)
    if status != 200:
        raise WarmupError(f"{endpoint.base_url}/health answered HTTP {status}")
    warmup.checks.append({"check": "health", "endpoint": endpoint.pk})


def rollout_warm_up(*, actor: AbstractBaseUser | None, rollout: Rollout) -> Rollout:
    """Warming → running(step 0) once the candidate is verified, started, warmed and ready;
    → aborted with the reason otherwise (see the module docstring)."""
    rollout.refresh_from_db()
    if rollout.state != Rollout.State.WARMING:
        raise ValidationError(f"Rollout #{rollout.pk} is {rollout.state}; warm-up needs warming.")
    warmup = Warmup(deadline=time.monotonic() + float(settings.ROLLOUT_WARMUP_TIMEOUT_S))
    try:
        warmup.artifact = artifact_check(rollout.candidate_version)
        for endpoint in _replicas(rollout, warmup):
            _warm(endpoint, rollout.model, warmup)
            if endpoint.state != Endpoint.State.READY:
                endpoint_set_state(actor=actor, endpoint=endpoint, state=Endpoint.State.READY)
    except WarmupError as exc:
        try:
            return rollout_abort(
                actor=actor, rollout=rollout, reason=f"Warmup failed: {exc}", data=warmup.as_dict()
            )
        finally:
            candidate_drain(rollout=rollout)
    try:
        return rollout_warmed(actor=actor, rollout=rollout, data=warmup.as_dict())
    except ValidationError:  # rolled back or cancelled while it warmed: stop what it started
        candidate_drain(rollout=rollout)
        raise
