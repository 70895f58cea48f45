"""The control document's cost: built once a second for the whole deployment, its queries do
not grow with the events per rollout or the decisions per pool."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from fixtures.router import redis_url

from apps.models.services import (
    model_create,
    model_version_create,
    model_version_publish,
    pool_create,
)
from apps.rollouts.models import Rollout
from apps.rollouts.services import rollout_create
from apps.scaling.models import ScalingDecision
from frontend.control_feed import control_document
from runtime.artifacts import manifest_digest

pytestmark = pytest.mark.integration

FILES = {"model.safetensors": "cd" * 32}
MANIFEST = {"tokenizer": "t", "max_context": 2048, "default_sampling": {}, "files": FILES}


def _world(rollouts: int, pools: int, decisions: int) -> None:
    for i in range(rollouts):
        model = model_create(actor=None, name=f"feed-{i}", task="chat")
        versions = []
        for label in ("v1", "v2"):
            version = model_version_create(
                actor=None, model=model, label=label, artifact_uri=f"file:///m/{i}/{label}",
                digest=manifest_digest(FILES), runtime="vllm", manifest=MANIFEST,
            )  # fmt: skip
            versions.append(model_version_publish(actor=None, version=version))
        rollout = rollout_create(
            actor=None, model=model, stable_version=versions[0], candidate_version=versions[1],
            mode="canary",
        )  # fmt: skip
        if i % 2:  # a finished one (test data): shown, but no prices read for it
            Rollout.objects.filter(pk=rollout.pk).update(state=Rollout.State.ROLLED_BACK)
    for p in range(pools):
        pool = pool_create(actor=None, name=f"feed-pool-{p}", hardware_tier="cpu",
                           cost_per_replica_hour=1)  # fmt: skip
        ScalingDecision.objects.bulk_create(
            ScalingDecision(pool=pool, policy="cpu", actuator="local", action="hold", current=1,
                            desired=1, reason="in band", signals={"inflight": n})
            for n in range(decisions)
        )  # fmt: skip


def test_control_document_queries_are_bounded(
    people: dict[str, User], namespace: str, django_assert_max_num_queries: Any
) -> None:
    _world(rollouts=6, pools=3, decisions=200)
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url())
    try:
        # rollouts + their events (2), prices for the 3 active ones (2 each), pools, endpoint
        # counts, one decisions query per pool
        with django_assert_max_num_queries(2 + 3 * 2 + 2 + 3):
            started = time.perf_counter()
            document = control_document(client, namespace)
            took = time.perf_counter() - started
    finally:
        client.close()
    assert len(document["rollouts"]) == 6
    assert [len(p["decisions"]) for p in document["scaling"]] == [10, 10, 10]
    assert all(len(p["history"]) == 200 for p in document["scaling"])
    print(f"control document: {took * 1000:.1f} ms, {len(str(document))} chars")
