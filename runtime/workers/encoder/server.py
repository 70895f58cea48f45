"""The encoder worker's HTTP API (aiohttp): OpenAI ``/v1/embeddings`` and our classifications.

Routes:

- ``POST /v1/embeddings``: OpenAI's request (``input`` a string, a list of strings, a token
  array or a list of token arrays; ``encoding_format`` ``float`` or ``base64``) and response
  (``data[].embedding``, ``usage.prompt_tokens``/``total_tokens``).
- ``POST /v1/classifications``: ``{"model", "input"}`` → ``data[i] = {"index", "label",
  "scores": {label: probability}}`` with the same ``usage``.
- ``POST /switchyard/v1/batch``: ``{"requests": [{"path", "body", "slo_ms"?}, ...]}`` →
  ``{"responses": [{"status", "body"}, ...]}``: the router's coalesced call; every request is
  validated and answered on its own, so a bad one fails alone; ``slo_ms`` (its class's SLO)
  tightens that request's deadline.
- ``GET /health``, ``GET /v1/models``, ``GET /metrics``.

Each input becomes one job of the :class:`~.batcher.DynamicBatcher`; the request's deadline is
``X-Switchyard-Deadline-Ms`` (milliseconds left) when given, else the policy's SLO. While
draining, new requests get 503.
"""

from __future__ import annotations

import asyncio
import base64
import struct
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from runtime.workers.encoder.batcher import DynamicBatcher
from runtime.workers.encoder.metrics import EncoderMetrics
from runtime.workers.encoder.model import Encoder, InputError

MAX_INPUTS = 2048
DEADLINE_HEADER = "X-Switchyard-Deadline-Ms"
BATCH_PATH = "/switchyard/v1/batch"
TASK_PATHS = {"/v1/embeddings": "embed", "/v1/classifications": "classify"}


class RequestError(Exception):
    """A request the worker refuses; ``status`` and an OpenAI-shaped body."""

    def __init__(self, status: int, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": str(self), "type": kind, "param": self.param, "code": None}}


@dataclass(slots=True)
class Inputs:
    ids: list[list[int]]

    @property
    def tokens(self) -> int:
        return sum(len(ids) for ids in self.ids)


class EncoderService:
    """The worker's state: the model, its batcher, metrics, and whether it is draining."""

    def __init__(
        self,
        encoder: Encoder,
        batcher: DynamicBatcher,
        *,
        model_name: str,
        aliases: tuple[str, ...] = (),
    ) -> None:
        self.encoder = encoder
        self.batcher = batcher
        self.model_name = model_name
        self.names = (model_name, *aliases)  # e.g. an embedding and a classification model
        self.metrics = EncoderMetrics(model_name)
        self.draining = False
        self.in_flight = 0  # HTTP requests being answered

    # --- parsing ----------------------------------------------------------------------

    def parse_inputs(self, body: Any) -> Inputs:  # noqa: PLR0912 - one branch per input form
        if not isinstance(body, dict):
            raise RequestError(400, "the request body must be a JSON object")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise RequestError(400, "'model' is required", param="model")
        if model not in self.names:
            raise RequestError(404, f"The model '{model}' does not exist.", param="model")
        raw = body.get("input")
        if isinstance(raw, str):
            items: list[Any] = [raw]
        elif isinstance(raw, list) and raw and all(isinstance(x, int) for x in raw):
            items = [raw]  # one token array
        elif isinstance(raw, list) and raw:
            items = raw
        else:
            raise RequestError(400, "'input' must be a non-empty string or list", param="input")
        if len(items) > MAX_INPUTS:
            raise RequestError(400, f"at most {MAX_INPUTS} inputs per request", param="input")
        texts: list[tuple[int, str]] = []
        ids: list[list[int] | None] = []
        for index, item in enumerate(items):
            if isinstance(item, str):
                if not item:
                    raise RequestError(400, f"input[{index}] is an empty string", param="input")
                texts.append((index, item))
                ids.append(None)
            elif isinstance(item, list) and all(
                isinstance(x, int) and not isinstance(x, bool) for x in item
            ):
                try:
                    ids.append(self.encoder.check_ids(item))
                except InputError as exc:
                    raise RequestError(400, f"input[{index}]: {exc}", param="input") from None
            else:
                raise RequestError(
                    400, f"input[{index}] must be a string or a token array", param="input"
                )
        if texts:
            for (index, _), tokens in zip(
                texts, self.encoder.tokenize([t for _, t in texts]), strict=True
            ):
                ids[index] = tokens
        return Inputs(ids=[x for x in ids if x is not None])

    def deadline(self, header: str | None) -> float | None:
        if header is None:
            return None
        try:
            ms = float(header)
        except ValueError:
            raise RequestError(400, f"{DEADLINE_HEADER} must be a number") from None
        return time.monotonic() + max(0.0, ms) / 1000.0

    @staticmethod
    def within_slo(deadline: float | None, slo_ms: Any) -> float | None:
        """``deadline`` tightened to now + the request class's SLO, when one is given."""
        if not isinstance(slo_ms, int | float) or isinstance(slo_ms, bool) or slo_ms <= 0:
            return deadline
        by_slo = time.monotonic() + slo_ms / 1000.0
        return by_slo if deadline is None else min(deadline, by_slo)

    # --- answering ----------------------------------------------------------------------

    async def answer(self, path: str, body: Any, deadline: float | None) -> dict[str, Any]:
        """One request's response document; raises RequestError."""
        task = TASK_PATHS.get(path)
        if task is None:
            raise RequestError(404, f"no route {path}")
        if task == "embed" and isinstance(body, dict):
            fmt = body.get("encoding_format")
            if fmt not in (None, "float", "base64"):
                raise RequestError(
                    400, "'encoding_format' must be 'float' or 'base64'", param="encoding_format"
                )
            dims = body.get("dimensions")
            if dims is not None and dims != self.encoder.info.dimensions:
                raise RequestError(
                    400,
                    f"this model has {self.encoder.info.dimensions} dimensions; "
                    "it cannot return another number",
                    param="dimensions",
                )
        inputs = self.parse_inputs(body)
        try:
            results = await self.batcher.submit_many(task, inputs.ids, deadline=deadline)
        except InputError as exc:
            raise RequestError(400, str(exc), param="input") from None
        usage = {"prompt_tokens": inputs.tokens, "total_tokens": inputs.tokens}
        if task == "embed":
            b64 = isinstance(body, dict) and body.get("encoding_format") == "base64"
            data = [
                {"object": "embedding", "index": i, "embedding": _b64(v) if b64 else v}
                for i, v in enumerate(results)
            ]
        else:
            labels = self.encoder.info.labels
            data = [
                {
                    "object": "classification",
                    "index": i,
                    "label": labels[max(range(len(p)), key=p.__getitem__)],
                    "scores": dict(zip(labels, p, strict=True)),
                }
                for i, p in enumerate(results)
            ]
        return {"object": "list", "data": data, "model": body["model"], "usage": usage}


def _b64(vector: list[float]) -> str:
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


def _error(exc: RequestError) -> web.Response:
    return web.json_response(exc.body(), status=exc.status)


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def build_app(service: EncoderService) -> web.Application:
    """The aiohttp application; the caller starts/stops the batcher around it."""

    async def read_json(request: web.Request) -> Any:
        try:
            return await request.json()
        except ValueError:
            raise RequestError(400, "the body is not valid JSON") from None

    def guarded(route: str, inner: Callable[[web.Request], Awaitable[Any]]) -> Handler:
        async def handler(request: web.Request) -> web.StreamResponse:
            if service.draining:
                exc = RequestError(503, "the worker is draining; retry on another endpoint")
                service.metrics.on_request(route, 503)
                return _error(exc)
            service.in_flight += 1
            try:
                document = await inner(request)
            except RequestError as exc:
                service.metrics.on_request(route, exc.status)
                return _error(exc)
            finally:
                service.in_flight -= 1
            service.metrics.on_request(route, 200)
            return web.json_response(document)

        return handler

    async def unary(request: web.Request) -> Any:
        body = await read_json(request)
        deadline = service.deadline(request.headers.get(DEADLINE_HEADER))
        return await service.answer(request.path, body, deadline)

    async def batch(request: web.Request) -> Any:
        body = await read_json(request)
        deadline = service.deadline(request.headers.get(DEADLINE_HEADER))
        items = body.get("requests") if isinstance(body, dict) else None
        if not isinstance(items, list) or not items:
            raise RequestError(400, "'requests' must be a non-empty list", param="requests")

        async def one(item: Any) -> dict[str, Any]:
            if not isinstance(item, dict) or not isinstance(item.get("path"), str):
                error = RequestError(400, "each request needs a 'path' and a 'body'")
                return {"status": error.status, "body": error.body()}
            mine = service.within_slo(deadline, item.get("slo_ms"))
            try:
                document = await service.answer(item["path"], item.get("body"), mine)
            except RequestError as exc:
                return {"status": exc.status, "body": exc.body()}
            return {"status": 200, "body": document}

        return {"responses": list(await asyncio.gather(*(one(item) for item in items)))}

    async def health(_: web.Request) -> web.Response:
        return web.Response(status=503 if service.draining else 200)

    async def models(_: web.Request) -> web.Response:
        cards = [
            {"id": name, "object": "model", "owned_by": "switchyard"} for name in service.names
        ]
        return web.json_response({"object": "list", "data": cards})

    async def metrics(_: web.Request) -> web.Response:
        batcher = service.batcher
        text = service.metrics.render(
            running=batcher.running,
            waiting=batcher.waiting,
            wait_cap_s=batcher.queue.wait_cap(128),
            coefficients=batcher.cost.coefficients(),
        )
        return web.Response(body=text, content_type="text/plain", charset="utf-8")

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_post("/v1/embeddings", guarded("/v1/embeddings", unary))
    app.router.add_post("/v1/classifications", guarded("/v1/classifications", unary))
    app.router.add_post(BATCH_PATH, guarded(BATCH_PATH, batch))
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    return app
