"""What the local actuator runs, by name (one launcher per runtime), and the real workers'
path: ``manage.py serve_model`` registers its own endpoint, the actuator records it, keeps a
warm one out of routing, promotes it, and ``manage.py stop_replicas`` stops them all."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from django.conf import settings
from django.core.management import call_command
from django.db import connection
from fixtures.wait import eventually

from apps.models.models import Endpoint, Pool
from apps.models.services import (
    model_create,
    model_version_create,
    model_version_publish,
    pool_create,
)
from apps.scaling.actuators.base import ActuatorError
from apps.scaling.actuators.launchers import (
    LaunchSpec,
    launcher,
    launcher_for_runtime,
    registry,
)
from apps.scaling.actuators.local import LocalActuator
from apps.scaling.services import (
    pool_scaling_get_or_create,
    pool_scaling_update,
    scaling_namespace,
)
from apps.scaling.tasks import ENV_ACTUATOR, actuator_from_env, autoscale_tick
from runtime.artifacts import compute_manifest, manifest_digest
from runtime.policy_names import UnknownPolicyError
from runtime.procs import cmdline, pid_alive

pytestmark = pytest.mark.integration

SPEC = LaunchSpec(model="demo-llama", label="v1", pool="cpu", port=4321, capacity=None,
                  log_dir=Path("/v/log"), extra_args=("--seed", "1"), grace_s=2.0)  # fmt: skip


@pytest.mark.unit
def test_launchers_by_runtime_and_by_name() -> None:
    assert sorted(registry()) == ["serve_encoder", "serve_model", "simulator"]
    assert launcher_for_runtime("vllm").name == "serve_model"
    assert launcher_for_runtime("torch").name == "serve_encoder"
    assert launcher_for_runtime("simulator").name == "simulator"
    assert launcher_for_runtime("simulator", {"simulator": "serve_model"}).name == "serve_model"
    with pytest.raises(UnknownPolicyError, match="unknown launcher 'tgi'"):
        launcher_for_runtime("tgi")


@pytest.mark.unit
def test_command_lines_stay_recognisable() -> None:
    """Operators and the chaos suite find replicas by command line."""
    vllm = " ".join(launcher("serve_model").argv(SPEC))
    assert "manage.py serve_model --model demo-llama --label v1 --pool cpu --port 4321" in vllm
    assert "--capacity 8 --grace 2.0 --engine-log /v/log/cpu-4321-engine.log" in vllm
    assert launcher("serve_model").argv(SPEC)[-1] == "--engine-args=--seed 1"
    encoder = " ".join(launcher("serve_encoder").argv(SPEC))
    assert "manage.py serve_encoder --model demo-llama --label v1 --pool cpu --port 4321" in encoder
    assert "--capacity 16" in encoder
    sim = " ".join(launcher("simulator").argv(SPEC))
    assert "-m runtime.workers.simulator --model demo-llama --port 4321 --max-num-seqs 8" in sim


def subprocess_database_url() -> str:
    conf = connection.settings_dict
    password = f":{conf['PASSWORD']}" if conf.get("PASSWORD") else ""
    return f"postgres://{conf['USER']}{password}@{conf['HOST']}:{conf['PORT']}/{conf['NAME']}"


@pytest.fixture
def prefix(settings: Any) -> Iterator[str]:
    settings.SNAPSHOT_REDIS_PREFIX = f"switchyard:test:launch:{uuid.uuid4().hex[:10]}"
    yield settings.SNAPSHOT_REDIS_PREFIX
    client = redis.Redis.from_url(settings.REDIS_URL)
    for key in client.scan_iter(f"{settings.SNAPSHOT_REDIS_PREFIX}*"):
        client.delete(key)
    client.close()


@pytest.fixture
def pool(transactional_db: Any, tmp_path: Path) -> Pool:
    """A pool that never ran a replica; its scaling settings name the version to start."""
    folder = tmp_path / "artifact"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    _, files = compute_manifest(folder)
    model = model_create(actor=None, name="self-reg", task="chat")
    version = model_version_create(
        actor=None, model=model, label="v1", artifact_uri=folder.as_uri(), runtime="simulator",
        digest=manifest_digest(files),
        manifest={"files": files, "max_context": 2048, "tokenizer": "t", "default_sampling": {}},
    )  # fmt: skip
    model_version_publish(actor=None, version=version)
    pool = pool_create(
        actor=None, name="real", hardware_tier="cpu", cost_per_replica_hour="0", max_replicas=2,
        warm_replicas=1,
    )  # fmt: skip
    pool_scaling_update(
        actor=None, scaling=pool_scaling_get_or_create(pool=pool), version_id=version.pk
    )
    return pool


@pytest.mark.integration
def test_serve_model_registers_itself_warm_is_unrouted_and_stop_replicas_stops_all(
    pool: Pool, prefix: str, tmp_path: Path
) -> None:
    actuator = LocalActuator(
        redis_url=settings.REDIS_URL, namespace=scaling_namespace(), log_dir=tmp_path / "log",
        launchers={"simulator": "serve_model"}, start_timeout_s=90, grace_s=1,
        env={**os.environ, "DATABASE_URL": subprocess_database_url()},
    )  # fmt: skip
    try:
        routed, took = actuator.start(pool, routed=True)
        assert routed.state == Endpoint.State.READY  # the worker moved it there itself
        assert not took.warm
        assert took.seconds > 0
        warm, _ = actuator.start(pool, routed=False)
        warm.refresh_from_db()
        assert warm.state == Endpoint.State.DRAINING  # loaded, out of routing
        records = actuator.records(pool)
        assert {routed.pk: False, warm.pk: True} == {i: r.warm for i, r in records.items()}
        assert "manage.py serve_model --model self-reg" in cmdline(records[routed.pk].pid)
        assert actuator.observe(pool).serving == 1
        assert actuator.observe(pool).warm == 1
        promoted = actuator.promote(warm)
        assert promoted.warm
        assert (actuator.observe(pool).serving, actuator.observe(pool).warm) == (2, 0)
        pids = [r.pid for r in actuator.records(pool).values()]
        call_command("stop_replicas")  # what `up` runs when it stops
        assert not any(pid_alive(pid) for pid in pids)
        assert set(Endpoint.objects.values_list("state", flat=True)) == {Endpoint.State.GONE}
        assert actuator.records(pool) == {}
    finally:
        actuator.stop_all(pool)
        actuator.close()


@pytest.mark.integration
def test_a_worker_that_exits_while_starting_is_an_error(
    pool: Pool, prefix: str, tmp_path: Path
) -> None:
    actuator = LocalActuator(
        redis_url=settings.REDIS_URL, namespace=scaling_namespace(), log_dir=tmp_path / "log",
        launchers={"simulator": "serve_model"}, start_timeout_s=90,
        env={**os.environ, "DATABASE_URL": "postgres://postgres@127.0.0.1:1/nothing"},
    )  # fmt: skip
    try:
        with pytest.raises(ActuatorError, match="replica did not start: the worker exited"):
            actuator.start(pool, routed=True)
        assert actuator.records(pool) == {}
    finally:
        actuator.close()


@pytest.mark.integration
def test_a_replica_dies_with_the_process_that_started_it(
    pool: Pool, prefix: str, tmp_path: Path
) -> None:
    """``death_signal`` (a Celery worker outside `up` uses it): the replica gets SIGTERM when its
    starter goes (PR_SET_PDEATHSIG follows the starting thread, so a thread stands in for a
    killed process), and the next observation takes its endpoint out."""
    actuator = LocalActuator(
        redis_url=settings.REDIS_URL, namespace=scaling_namespace(), log_dir=tmp_path / "log",
        death_signal=signal.SIGTERM, start_timeout_s=30,
    )  # fmt: skip
    started: list[Endpoint] = []

    def starter() -> None:
        try:
            started.append(actuator.start(pool, routed=True)[0])
        finally:
            connection.close()

    try:
        thread = threading.Thread(target=starter)
        thread.start()
        thread.join(60)
        (endpoint,) = started
        record = actuator.records(pool)[endpoint.pk]
        eventually(lambda: not record.alive, timeout=10, what="the replica dying with its starter")
        assert actuator.observe(pool).serving == 0
        endpoint.refresh_from_db()
        assert endpoint.state == Endpoint.State.GONE
        assert actuator.records(pool) == {}
    finally:
        actuator.stop_all(pool)
        actuator.close()


@pytest.mark.db
def test_the_tick_builds_the_local_actuator_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, db: Any, prefix: str
) -> None:
    monkeypatch.delenv(ENV_ACTUATOR, raising=False)
    assert actuator_from_env() is None
    assert autoscale_tick() == 0  # autoscaling off
    monkeypatch.setenv(ENV_ACTUATOR, "local")
    actuator = actuator_from_env()
    assert isinstance(actuator, LocalActuator)
    actuator.close()
    pool_create(actor=None, name="idle", hardware_tier="cpu", cost_per_replica_hour="0")
    assert autoscale_tick() == 1  # one decision: hold, nothing to run
