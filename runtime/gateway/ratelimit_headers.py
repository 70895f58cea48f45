"""The ``x-ratelimit-*`` response headers, with OpenAI's names and meanings.

From the :class:`~runtime.admission.limits.RateState` that the tenant's admission read (the
same Redis script call that admitted it, or the router's allowance or fallback counters: no
extra round trip):

- ``x-ratelimit-limit-requests`` / ``-tokens``: the tenant's RPM / TPM;
- ``x-ratelimit-remaining-requests`` / ``-tokens``: what is left of them now (after this
  request's admission: one request, and prompt + ``max_tokens`` debited as the worst case);
- ``x-ratelimit-reset-requests`` / ``-tokens``: the time until each is back to its full
  value, in OpenAI's duration format (``"17ms"``, ``"6.5s"``, ``"1m0s"``).

Every inference answer carries them once the request was admitted; a 429 of the tenant's
limits carries them too (with ``Retry-After``).
"""

from __future__ import annotations

from runtime.admission.limits import RateState

Headers = tuple[tuple[bytes, bytes], ...]


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``"250ms"`` under a second, ``"6.5s"``, ``"1m30s"``."""
    if seconds < 1.0:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(round(seconds, 3), 60.0)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


def ratelimit_headers(state: RateState) -> Headers:
    """The six headers for ``state``."""
    return (
        (b"x-ratelimit-limit-requests", b"%d" % state.requests_limit),
        (b"x-ratelimit-limit-tokens", b"%d" % state.tokens_limit),
        (b"x-ratelimit-remaining-requests", b"%d" % state.requests_left),
        (b"x-ratelimit-remaining-tokens", b"%d" % state.tokens_left),
        (b"x-ratelimit-reset-requests", duration(state.requests_reset_s).encode("ascii")),
        (b"x-ratelimit-reset-tokens", duration(state.tokens_reset_s).encode("ascii")),
    )
