"""The Batch API's routes on the router: ``/v1/files*`` and ``/v1/batches*``, forwarded.

The router keeps no batch state and never touches PostgreSQL: it authenticates the API key
against its snapshot (as for inference), then forwards the request to the control plane
(``SWITCHYARD_CONTROL_PLANE_URL``) with the principal it resolved in a signed header
(:mod:`runtime.internal_principal`); the control plane stores files and batches and answers
in OpenAI's shapes, which go back to the client as they are. The client's ``Authorization``
header is not forwarded: the control plane trusts the signature, never a key.

A file upload is bounded by its own cap (``SWITCHYARD_MAX_UPLOAD_BYTES``, 100 MiB by default),
not the 1 MiB cap of inference requests: a declared ``Content-Length`` over it is refused at
once, and a body is counted as it arrives and refused (413 ``upload_too_large``) as soon as it
passes the cap. The body is held whole before it is forwarded (the cap bounds the memory).
"""

from __future__ import annotations

import time
from typing import ClassVar

from runtime.gateway.auth import authenticate, bearer_token
from runtime.gateway.consumers import GatewayConsumer, header
from runtime.gateway.errors import NO_SNAPSHOT, ApiError
from runtime.internal_principal import HEADER, sign
from runtime.upstream.errors import UpstreamError

FORWARDED_HEADERS = (b"content-type", b"x-request-id")


class BatchApiConsumer(GatewayConsumer):
    """Every method of ``/v1/files*`` and ``/v1/batches*``; see the module docstring."""

    methods: ClassVar[tuple[str, ...]] = ("GET", "POST", "DELETE")

    def body_cap(self) -> int:
        return self.state.config.max_upload_bytes

    @staticmethod
    def too_large(cap: int) -> ApiError:
        return ApiError.of("upload_too_large", cap=cap)

    async def respond(self, body: bytes) -> None:
        config = self.state.config
        control = self.state.control
        if control is None or not config.internal_secret:
            raise ApiError.of("batch_api_unavailable", reason="no control plane is configured")
        snapshot = self.state.snapshot
        if snapshot is None:
            raise ApiError.of("not_ready", reason=NO_SNAPSHOT)
        now = time.time()
        principal = authenticate(
            snapshot, bearer_token(header(self.scope, b"authorization")), now=now
        )
        self.state.key_usage.record(principal.key.prefix, now)
        method = str(self.scope["method"])
        path = str(self.scope["path"])
        headers = {
            name.decode(): value.decode("latin-1")
            for name in FORWARDED_HEADERS
            if (value := header(self.scope, name)) is not None
        }
        headers[HEADER] = sign(
            config.internal_secret, method=method, path=path,
            tenant=principal.tenant.slug, key_prefix=principal.key.prefix, now=now,
        )  # fmt: skip
        query = bytes(self.scope.get("query_string", b"")).decode("latin-1")
        try:
            answer = await control.forward(method, path, query=query, headers=headers, body=body)
        except UpstreamError as exc:
            raise ApiError.of("batch_api_unavailable", reason=str(exc)) from exc
        length = (b"content-length", str(len(answer.body)).encode("ascii"))
        passed = [(k.encode(), v.encode("latin-1")) for k, v in answer.headers]
        await self.start_response(answer.status, [*passed, length])
        await self.send_chunk(answer.body, last=True)
