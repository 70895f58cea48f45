"""Fresh request ids: 32 lowercase hex characters (the shape a ``uuid4().hex`` had), unique
within a process, and a different random prefix per :class:`RequestIds` (per router process);
the client's sane ``X-Request-Id`` is kept, an insane one replaced."""

from __future__ import annotations

import re

import pytest

from runtime.gateway.consumers import request_id_for
from runtime.gateway.request_ids import RequestIds

pytestmark = pytest.mark.unit

HEX32 = re.compile(r"[0-9a-f]{32}")


def test_fresh_ids_are_32_hex_unique_and_prefixed_per_process() -> None:
    ids, other = RequestIds(), RequestIds()
    drawn = [ids.next() for _ in range(1000)]
    assert all(HEX32.fullmatch(one) for one in drawn)
    assert len(set(drawn)) == len(drawn)
    assert drawn[0][:16] == drawn[-1][:16]  # one process, one prefix
    assert other.next()[:16] != drawn[0][:16]  # another process: another (2^-64 to collide)


@pytest.mark.parametrize(
    ("sent", "kept"), [(b"client-req-42", True), (b"bad id", False), (b"x" * 129, False)]
)
def test_a_sane_client_id_is_kept(sent: bytes, kept: bool) -> None:
    scope = {"headers": [(b"host", b"t"), (b"x-request-id", sent)]}
    got = request_id_for(scope, RequestIds())
    assert (got == sent.decode()) is kept
    if not kept:
        assert HEX32.fullmatch(got)
