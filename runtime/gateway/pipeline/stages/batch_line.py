"""Stage ``batch_line``: a request the Batch API's executor sent for one line of a batch.

The executor (apps/batches/executor.py) marks each line's request with
``X-Switchyard-Batch-Line``: the line's ledger reference, signed with the internal secret for
the tenant of the batch's key (:func:`runtime.internal_principal.sign_line`). A mark that
verifies sets ``ctx.batch_line``, and then

- ``admit`` takes the request in the tenant's batch lane (:func:`runtime.contract.batch_lane`):
  a concurrency allowance of its own (``SWITCHYARD_BATCH_CONCURRENCY``), never the tenant's
  online RPM/TPM/concurrency, so a batch cannot make the tenant's interactive calls 429; the
  credits are the tenant's as ever (escrow, 402);
- ``settle`` bills it under the usage event id ``batch-line-<ref>``, the same on every try of
  the line, so the ledger (unique on the event id) charges a line once however often it ran.

No mark: nothing changes. A mark that does not verify (forged, another tenant's, expired, or
no secret configured): 401 ``invalid_batch_line``.
"""

from __future__ import annotations

import time

from runtime.gateway.bundles import AdmissionDeps
from runtime.gateway.errors import ApiError
from runtime.gateway.pipeline.context import RequestContext
from runtime.internal_principal import PrincipalRefusedError, verify_line

_HEADER = b"x-switchyard-batch-line"


class BatchLineMark:
    name = "batch_line"

    def __init__(self, deps: AdmissionDeps) -> None:
        self._secret = deps.internal_secret

    async def __call__(self, ctx: RequestContext) -> None:
        raw = ctx.headers(_HEADER)
        if raw is None:
            return
        tenant = ctx.ready_principal.tenant.slug
        try:
            ctx.batch_line = verify_line(self._secret, raw.decode("ascii", "replace"),
                                         tenant=tenant, now=time.time())  # fmt: skip
        except PrincipalRefusedError as exc:
            raise ApiError.of("invalid_batch_line", reason=str(exc).removeprefix("the ")) from None
