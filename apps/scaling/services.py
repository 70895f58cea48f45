"""Autoscaling services: read a pool's signals, decide, record the decision, actuate."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import msgspec
import redis
from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from redis.exceptions import LockError, RedisError
from redis.lock import Lock

from apps.common.audit import audit_changes, audit_record
from apps.models.models import Pool
from apps.scaling.actuators.base import Actuation, Actuator, ActuatorError
from apps.scaling.models import PoolScaling, ReplicaStart, ScalingDecision
from apps.scaling.selectors import autoscaled_pools
from runtime.contract import namespace_of, scaling_leader_key, scaling_signals_key
from runtime.scaling.controller import Bounds, Cooldowns, History, Plan, decide
from runtime.scaling.policies import ScalingTarget
from runtime.scaling.publisher import parse_entries
from runtime.scaling.registry import names as scaling_policy_names
from runtime.scaling.registry import policy_for_tier, scaling_policy
from runtime.scaling.signals import PoolSignals, aggregate

if TYPE_CHECKING:
    from apps.scaling.actuators.local import LocalActuator

SIGNALS_STALE_S = 10.0

logger = logging.getLogger(__name__)


def scaling_namespace() -> str:
    return namespace_of(settings.SNAPSHOT_REDIS_PREFIX)


def pool_signals_read(
    *,
    client: redis.Redis[bytes],
    namespace: str,
    pool: str,
    now: float,
    stale_s: float = SIGNALS_STALE_S,
) -> PoolSignals:
    """The pool's signals summed over the routers that published within ``stale_s``."""
    raw = client.hgetall(scaling_signals_key(namespace, pool))
    return aggregate(pool, parse_entries(raw, now=now, stale_s=stale_s))


def pool_scaling_get_or_create(*, pool: Pool) -> PoolScaling:
    scaling, _ = PoolScaling.objects.get_or_create(pool=pool)
    return scaling


def _scaling_errors(scaling: PoolScaling) -> dict[str, str]:
    """What the model's own validators miss: a policy the registry knows, a non-negative idle
    time (the controller would otherwise crash or scale to zero at once), a published version
    (the actuator verifies and loads only published artifacts)."""
    errors = {}
    if scaling.policy and scaling.policy not in scaling_policy_names():
        known = ", ".join(scaling_policy_names())
        errors["policy"] = f"Unknown scaling policy {scaling.policy!r}; known: {known} (or blank)."
    if scaling.idle_to_zero_s is not None and scaling.idle_to_zero_s < 0:
        errors["idle_to_zero_s"] = "Give a non-negative number of seconds, or null (never)."
    if scaling.version is not None and not scaling.version.is_published:
        errors["version"] = (
            f"Version {scaling.version.pk} is not published; only a published version can run."
        )
    return errors


def _stored(scaling: PoolScaling, names: Iterable[str]) -> dict[str, object]:
    """The fields' stored values (a foreign key's id, not the object) for the audit log."""
    fields = scaling._meta
    attnames = {name: getattr(fields.get_field(name), "attname", name) for name in names}
    return {name: getattr(scaling, attname) for name, attname in attnames.items()}


def pool_scaling_update(
    *, actor: AbstractBaseUser | None, scaling: PoolScaling, **changes: object
) -> PoolScaling:
    """Change a pool's autoscaling settings (validated, audited); the autoscaler reads them at
    its next tick."""
    before = _stored(scaling, changes)
    for name, value in changes.items():
        setattr(scaling, name, value)
    scaling.full_clean()
    errors = _scaling_errors(scaling)
    if errors:
        raise ValidationError(errors)
    with transaction.atomic():
        scaling.save()
        old, new = audit_changes(before, _stored(scaling, changes))
        audit_record(
            actor=actor, action="pool_scaling.update", target=scaling, before=old, after=new
        )
    return scaling


def pool_plan(
    *, pool: Pool, scaling: PoolScaling, signals: PoolSignals, serving: int, warm: int, now: float
) -> tuple[str, Plan]:
    """The controller's plan for ``pool`` (pure; nothing is written)."""
    name = scaling.policy or policy_for_tier(pool.hardware_tier)
    plan = decide(
        scaling_policy(name),
        signals,
        current=serving,
        warm_ready=warm,
        bounds=Bounds(pool.min_replicas, pool.max_replicas, pool.warm_replicas),
        cooldowns=Cooldowns(scaling.out_cooldown_s, scaling.in_cooldown_s, scaling.idle_to_zero_s),
        target=ScalingTarget(scaling.target_low, scaling.target_high, scaling.wait_slo_s),
        history=History(scaling.last_out_at, scaling.last_in_at, scaling.idle_since),
        now=now,
    )
    return name, plan


def scaling_decision_record(
    *, pool: Pool, policy: str, actuator: str, plan: Plan, signals: PoolSignals,
    actuation: Actuation,
) -> ScalingDecision:  # fmt: skip
    with transaction.atomic():
        decision = ScalingDecision.objects.create(
            pool=pool, policy=policy, actuator=actuator, action=plan.action,
            current=plan.current, desired=plan.desired, reason=plan.why,
            signals=msgspec.to_builtins(signals), promoted=actuation.promoted,
            started=actuation.started, stopped=actuation.stopped, error=actuation.error,
        )  # fmt: skip
        ReplicaStart.objects.bulk_create(
            ReplicaStart(pool=pool, version_id=s.version_id, warm=s.warm, seconds=s.seconds)
            for s in actuation.starts
        )
    starts = ", ".join(f"{'warm' if s.warm else 'cold'} {s.seconds:.3f}s" for s in actuation.starts)
    logger.info(
        "scaling %s: %s %d -> %d (%s)%s%s", pool.name, plan.action, plan.current, plan.desired,
        plan.why, f"; starts: {starts}" if starts else "",
        f"; error: {actuation.error}" if actuation.error else "",
    )  # fmt: skip
    return decision


def pool_autoscale(
    *,
    pool: Pool,
    actuator: Actuator,
    signals: PoolSignals,
    now: float,
    clock: Callable[[], float] | None = None,
) -> ScalingDecision:
    """One controller step for ``pool``: plan, actuate, record the decision and the history.

    A scale-out or -in counts from when the actuator finished it (``clock()``, default ``now``):
    a vLLM replica that took a minute to start gets its full cooldown after it serves."""
    scaling = pool_scaling_get_or_create(pool=pool)
    try:
        replicas = actuator.observe(pool)
    except ActuatorError as exc:
        plan = Plan("hold", 0, 0, f"cannot observe replicas: {exc}")
        return scaling_decision_record(
            pool=pool, policy=scaling.policy, actuator=actuator.name, plan=plan, signals=signals,
            actuation=Actuation(error=str(exc)),
        )  # fmt: skip
    policy, plan = pool_plan(
        pool=pool, scaling=scaling, signals=signals, serving=replicas.serving,
        warm=replicas.warm, now=now,
    )  # fmt: skip
    actuation = actuator.apply(pool, plan)
    history = (
        _finished_at(plan.history, now, clock() if clock is not None else now)
        if not actuation.error
        else History(scaling.last_out_at, scaling.last_in_at, plan.history.idle_since)
    )
    PoolScaling.objects.filter(pk=scaling.pk).update(
        last_out_at=history.last_out_at, last_in_at=history.last_in_at,
        idle_since=history.idle_since,
    )  # fmt: skip
    return scaling_decision_record(
        pool=pool, policy=policy, actuator=actuator.name, plan=plan, signals=signals,
        actuation=actuation,
    )  # fmt: skip


def _finished_at(history: History, now: float, done: float) -> History:
    """``history`` with the changes stamped ``now`` moved to ``done``."""
    return History(
        done if history.last_out_at == now else history.last_out_at,
        done if history.last_in_at == now else history.last_in_at,
        history.idle_since,
    )


def autoscale_all(
    *,
    client: redis.Redis[bytes],
    actuator: Actuator,
    namespace: str,
    lock_ttl_s: float = 30.0,
    clock: Callable[[], float] = time.time,
) -> list[ScalingDecision] | None:
    """One tick over every autoscaled pool, by the one leader (None: another tick holds the
    lock). The lock expires after ``lock_ttl_s`` if its holder dies."""
    lock = client.lock(
        scaling_leader_key(namespace), timeout=lock_ttl_s, blocking=False, thread_local=False
    )
    if not lock.acquire(blocking=False):
        return None
    done = threading.Event()
    keeper = threading.Thread(
        target=_keep_lock, args=(lock, lock_ttl_s, done), name="scaling-leader", daemon=True
    )
    keeper.start()  # a tick that starts a vLLM replica takes longer than the TTL
    try:
        decisions = []
        for pool in autoscaled_pools():
            now = clock()
            signals = pool_signals_read(client=client, namespace=namespace, pool=pool.name, now=now)
            decisions.append(
                pool_autoscale(pool=pool, actuator=actuator, signals=signals, now=now, clock=clock)
            )
        return decisions
    finally:
        done.set()
        keeper.join(5.0)
        with contextlib.suppress(LockError):
            lock.release()


def _keep_lock(lock: Lock, ttl_s: float, done: threading.Event) -> None:
    """Extend the leader lock every third of its TTL while the tick runs (the lock still
    expires ``ttl_s`` after its holder dies)."""
    while not done.wait(ttl_s / 3):
        try:
            lock.extend(ttl_s, replace_ttl=True)
        except (LockError, RedisError, OSError) as exc:
            logger.warning("scaling leader lock not extended: %s", exc)


def local_replicas_stop_all(*, actuator: LocalActuator) -> int:
    """Stop every replica ``actuator`` started, in every pool; how many there were."""
    return sum(actuator.stop_all(pool) for pool in Pool.objects.order_by("id"))
