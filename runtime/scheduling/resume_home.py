"""Resume affinity: a preempted request resumes on the endpoint it ran on (issue #34).

A resume by continuation sends the prompt plus the text generated so far
(:mod:`runtime.gateway.resume`). On the endpoint the stream ran on, vLLM's automatic prefix
caching still holds that context's full blocks after the preemption (an aborted request's
blocks are freed but stay cached until evicted; the generated tokens' blocks too, as V1
hashes every full block), so the resume prefills only the uncached tail: measured on vLLM
CPU (``python -m bench.resume_vllm``), a resume there hits every full block of prompt and
generated text. Anywhere else it prefills the whole context again.

The rule, with the pool policy ``resume_affinity=on`` (:mod:`.settings`):

- the dispatcher notes the endpoint a stream ran on when it preempts it (its *home*);
- while the request waits to resume, its room is its home alone when the home has room;
- when the home is full it holds (no room anywhere) for up to ``resume_hold_ms`` after its
  preemption (default 0: no hold), then takes any endpoint with room, paying the whole
  prefill there;
- a home that is no longer a candidate (the engine died, drains, its circuit opened: the
  routing filters drop it) is ignored at once: a migration never waits for a dead endpoint.

A resume sent to its home is paced (:mod:`.pacing`) as a prefill of nothing: its engine
holds its context. The home is forgotten when the request leaves the queue (it resumes,
ends or is dropped). With ``resume_affinity=off`` (the default) a resume goes where the
placement puts any request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from runtime.snapshot import EndpointSnap


@dataclass(frozen=True, slots=True)
class ResumeHomeRule:
    """``affinity``: resume on the home endpoint; ``hold_s``: how long after its preemption
    a resume waits for its full home before it goes elsewhere."""

    affinity: bool = False
    hold_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.hold_s >= 0:
            raise ValueError(f"hold_s must be >= 0, got {self.hold_s!r}")


class ResumeHomes:
    """Where each preempted request ran, until it leaves the queue (module docstring)."""

    __slots__ = ("_homes", "held", "rule")

    def __init__(self, rule: ResumeHomeRule | None = None) -> None:
        self.rule = rule or ResumeHomeRule()
        self._homes: dict[str, tuple[int, float]] = {}  # request id -> (endpoint, hold until)
        self.held = 0  # room answers that held a resume for its full home (a counter)

    def __len__(self) -> int:
        return len(self._homes)

    def left(self, req_id: str, endpoint_id: int, now: float) -> None:
        """``req_id``'s stream was preempted on ``endpoint_id`` at ``now``."""
        if self.rule.affinity:
            self._homes[req_id] = (endpoint_id, now + self.rule.hold_s)

    def forget(self, req_id: str) -> int | None:
        """``req_id`` left the queue (resumed, ended or dropped); its home, if it had one."""
        entry = self._homes.pop(req_id, None)
        return None if entry is None else entry[0]

    def home(self, req_id: str) -> int | None:
        entry = self._homes.get(req_id)
        return None if entry is None else entry[0]

    def room(
        self,
        req_id: str,
        found: Sequence[EndpointSnap],
        candidates: Sequence[EndpointSnap],
        now: float,
    ) -> Sequence[EndpointSnap]:
        """The endpoints ``req_id`` may resume on now, of those with room (``found``) among
        the version's candidates: its home alone, none while it holds, else ``found``."""
        entry = self._homes.get(req_id)
        if entry is None or not self.rule.affinity:
            return found
        home, until = entry
        for endpoint in found:
            if endpoint.id == home:
                return (endpoint,)
        if now < until and any(e.id == home for e in candidates):
            self.held += 1
            return ()
        return found
