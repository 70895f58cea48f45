"""Admission: per-tenant rate limits (RPM, TPM) and concurrency caps, global across routers.

- :mod:`.limits` — the vocabulary (:class:`~.limits.Quota`, :class:`~.limits.Lease`,
  :class:`~.limits.LimitExceededError`) and :class:`~.limits.LocalLimits`, the per-process
  fallback;
- :mod:`.redis_limits` — :class:`~.redis_limits.RedisLimits`: one Lua script, one round trip
  per request, checks and debits all three atomically in Redis; settlement is batched off the
  request path; falls back to local limits while Redis is unreachable.

The queue-side admission (bounded bands, deadline-aware rejection, shedding) lives with the
queue in :mod:`runtime.scheduling`. Nothing here runs at import time.
"""
