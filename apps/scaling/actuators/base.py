"""The one interface every actuator implements."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from apps.models.models import Pool
from runtime.scaling.controller import Plan


class ActuatorError(RuntimeError):
    """The actuator could not carry out (all of) a plan; the decision records the message."""


@dataclass(frozen=True, slots=True)
class Replicas:
    serving: int  # routed replicas
    warm: int = 0  # loaded, not routed


@dataclass(frozen=True, slots=True)
class StartTime:
    version_id: int
    seconds: float
    warm: bool


@dataclass(slots=True)
class Actuation:
    promoted: int = 0
    started: int = 0
    stopped: int = 0
    starts: list[StartTime] = field(default_factory=list)
    error: str = ""


class Actuator(Protocol):
    name: str

    def observe(self, pool: Pool) -> Replicas:
        """The pool's replicas now."""
        ...

    def apply(self, pool: Pool, plan: Plan) -> Actuation:
        """Carry out ``plan`` (scale out / in / to zero, keep ``plan.warm`` warm)."""
        ...
