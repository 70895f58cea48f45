"""The simulator's aiohttp app: vLLM's OpenAI-compatible routes over the simulated engine.

Routes: ``GET /v1/models``, ``POST /v1/completions``, ``POST /v1/chat/completions``,
``POST /v1/embeddings``, ``GET /health``, ``GET /metrics``, and ``POST /reset_prefix_cache``
(vLLM serves it in dev mode, ``VLLM_SERVER_DEV_MODE=1``; the simulator always does, so a
benchmark can start every target from cold caches). With ``kv_events_endpoint`` the prefix
cache's changes are published as vLLM's KV events (``kv_publisher``). Run it with handler
cancellation on (``run()`` and aiohttp's test server do): a client that disconnects cancels its
handler, which aborts its sequence, so the slot and its KV reservation are freed at once.
"""

from __future__ import annotations

import random
import ssl
from collections.abc import AsyncIterator
from typing import Literal

from aiohttp import web
from aiohttp.typedefs import Handler

from runtime.workers.simulator import wire
from runtime.workers.simulator.config import SimulatorConfig
from runtime.workers.simulator.engine import Engine, Sequence
from runtime.workers.simulator.kv_publisher import KvEventPublisher
from runtime.workers.simulator.lora import LoraError, SimLoras
from runtime.workers.simulator.metrics import CONTENT_TYPE, SimulatorMetrics
from runtime.workers.simulator.prefix_cache import PrefixCache
from runtime.workers.simulator.protocol import (
    ApiError,
    GenerationRequest,
    check_model,
    parse_body,
    parse_chat,
    parse_completion,
    parse_embedding,
)
from runtime.workers.simulator.text import embedding_vector, output_words

CONFIG = web.AppKey("config", SimulatorConfig)
ENGINE = web.AppKey("engine", Engine)
METRICS = web.AppKey("metrics", SimulatorMetrics)
FAULTS = web.AppKey("faults", random.Random)
LORAS = web.AppKey("loras", SimLoras)
MAX_BODY_BYTES = 64 * 1024 * 1024


class _ConnectionAbortedError(Exception):
    """Raised after the simulator cut a connection on purpose (``fail_after_tokens``)."""


def create_app(config: SimulatorConfig) -> web.Application:
    """A fresh app with its own engine and metrics registry; the engine runs while it is up."""
    app = web.Application(middlewares=[_error_middleware], client_max_size=MAX_BODY_BYTES)
    metrics = SimulatorMetrics(model_name=config.model)
    cache = PrefixCache(config.prefix_cache) if config.prefix_cache.enabled else None
    engine = Engine(
        timing=config.timing, capacity=config.capacity, observer=metrics, prefix_cache=cache
    )
    metrics.bind(engine)
    app[CONFIG] = config
    app[ENGINE] = engine
    app[METRICS] = metrics
    app[FAULTS] = random.Random(config.seed)  # noqa: S311 (fault injection, not security)
    app[LORAS] = SimLoras(
        max_loras=config.max_loras,
        resident=max(config.max_loras, config.max_cpu_loras),
        load_s=config.lora_load_ms / 1000,
    )
    app.cleanup_ctx.append(_engine_lifecycle)
    app.router.add_get("/health", _health)
    app.router.add_get("/metrics", _metrics)
    app.router.add_get("/v1/models", _models)
    app.router.add_post("/v1/completions", _completions)
    app.router.add_post("/v1/chat/completions", _chat_completions)
    app.router.add_post("/v1/embeddings", _embeddings)
    app.router.add_post("/reset_prefix_cache", _reset_prefix_cache)
    app.router.add_post("/v1/load_lora_adapter", _load_lora)
    app.router.add_post("/v1/unload_lora_adapter", _unload_lora)
    return app


async def _engine_lifecycle(app: web.Application) -> AsyncIterator[None]:
    engine, endpoint = app[ENGINE], app[CONFIG].kv_events_endpoint
    publisher = None
    if endpoint is not None and engine.prefix_cache is not None:
        publisher = engine.prefix_cache.listener = KvEventPublisher(endpoint)
    engine.start()
    try:
        yield
    finally:
        await engine.stop()
        if publisher is not None:
            publisher.close()


@web.middleware
async def _error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except ApiError as exc:
        body = wire.error(exc.message, err_type=exc.err_type, status=exc.status, param=exc.param)
        return _json(body, status=exc.status)
    except _ConnectionAbortedError:
        return web.Response(status=500)  # never reaches the client: its connection is gone


def _json(body: wire.Json, status: int = 200) -> web.Response:
    return web.Response(body=wire.encode(body), status=status, content_type="application/json")


async def _health(request: web.Request) -> web.Response:
    return web.Response(status=200)


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def _reset_prefix_cache(request: web.Request) -> web.Response:
    cache = request.app[ENGINE].prefix_cache
    if cache is not None:
        cache.reset()
    return _json({"success": True})


async def _models(request: web.Request) -> web.Response:
    config = request.app[CONFIG]
    loaded = request.app[LORAS].loaded
    return _json(wire.models(config.model, config.max_model_len, wire.now(), loaded))


async def _load_lora(request: web.Request) -> web.Response:
    body = parse_body(await request.read())
    try:
        text = await request.app[LORAS].load(body.get("lora_name"), body.get("lora_path"))
    except LoraError as exc:
        kind = "NotFoundError" if exc.status == 404 else "BadRequestError"
        raise ApiError(exc.message, status=exc.status, err_type=kind) from None
    return web.Response(text=text)


async def _unload_lora(request: web.Request) -> web.Response:
    body = parse_body(await request.read())
    try:
        text = request.app[LORAS].unload(body.get("lora_name"))
    except LoraError as exc:
        raise ApiError(exc.message, status=exc.status, err_type="NotFoundError") from None
    return web.Response(text=text)


async def _completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def _chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def _generate(
    request: web.Request, kind: Literal["completion", "chat"]
) -> web.StreamResponse:
    config, engine = request.app[CONFIG], request.app[ENGINE]
    body = parse_body(await request.read())
    model = check_model(body, config, request.app[LORAS].loaded)
    if config.error_rate and request.app[FAULTS].random() < config.error_rate:
        raise ApiError(
            "injected failure (--error-rate)", err_type="InternalServerError", status=500
        )
    gen = parse_chat(body, config) if kind == "chat" else parse_completion(body, config)
    rid = wire.request_id(request.headers.get("X-Request-Id"))
    framer = wire.Framer(chat=kind == "chat", rid=rid, model=model)
    seq = engine.submit(
        request_id=framer.id,
        prompt_tokens=gen.prompt_tokens,
        max_tokens=gen.max_tokens,
        output_tokens=gen.output_tokens,
        finish_reason=gen.finish_reason,
        priority=gen.priority,
        words=output_words(gen.script, gen.seed),
        block_hashes=gen.block_hashes,
        rendered=gen.rendered,
    )
    limit = config.fail_after_tokens
    if limit is not None and gen.output_tokens <= limit:
        limit = None  # finishes before the planned failure
    try:
        if gen.stream:
            return await _stream(request, gen, framer, seq, limit)
        return await _collect(request, gen, framer, seq, limit)
    finally:
        engine.abort(seq)  # a no-op when it finished; frees the slot when the client left


async def _collect(
    request: web.Request,
    gen: GenerationRequest,
    framer: wire.Framer,
    seq: Sequence,
    limit: int | None,
) -> web.Response:
    parts: list[str] = []
    while limit != len(parts) and (tokens := await seq.next_tokens()) is not None:
        parts.extend(tokens if limit is None else tokens[: limit - len(parts)])
    if len(parts) < gen.output_tokens:
        _abort_connection(request)
    body = framer.full("".join(parts), gen.finish_reason, gen.prompt_tokens, len(parts))
    return _json(body)


async def _stream(
    request: web.Request,
    gen: GenerationRequest,
    framer: wire.Framer,
    seq: Sequence,
    limit: int | None,
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache"}
    )
    await response.prepare(request)
    sent = 0
    try:
        while limit != sent and (tokens := await seq.next_tokens()) is not None:
            if sent == 0 and (opening := framer.first_chunk()) is not None:
                await response.write(wire.sse(opening))  # sent with the first token, as vLLM
            if limit is not None:
                tokens = tokens[: limit - sent]
            sent += len(tokens)
            finish = gen.finish_reason if sent >= gen.output_tokens else None
            chunk = framer.delta("".join(tokens), finish)
            if gen.continuous_usage:
                chunk["usage"] = wire.usage(gen.prompt_tokens, sent)
            await response.write(wire.sse(chunk))
        if sent < gen.output_tokens:
            _abort_connection(request)
        if gen.include_usage:
            await response.write(wire.sse(framer.usage_chunk(gen.prompt_tokens, sent)))
        await response.write(wire.DONE_FRAME)
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client went away; the caller's ``finally`` frees the sequence
    return response


async def _embeddings(request: web.Request) -> web.Response:
    config, engine = request.app[CONFIG], request.app[ENGINE]
    body = parse_body(await request.read())
    check_model(body, config)
    emb = parse_embedding(body, config)
    rid = wire.request_id(request.headers.get("X-Request-Id"))
    seqs = [
        engine.submit(
            request_id=f"embd-{rid}-{index}",
            prompt_tokens=tokens,
            max_tokens=0,
            output_tokens=0,
            finish_reason="stop",
            priority=emb.priority,
            words=iter(()),
        )
        for index, (tokens, _) in enumerate(emb.inputs)
    ]
    try:
        for seq in seqs:  # prefill is the whole cost of an embedding
            await seq.next_tokens()
    finally:
        for seq in seqs:
            engine.abort(seq)
    vectors = [embedding_vector(seed, config.embedding_dim) for _, seed in emb.inputs]
    return _json(
        wire.embeddings(
            rid=rid,
            model=config.model,
            vectors=vectors,
            encoding=emb.encoding_format,
            prompt_tokens=emb.prompt_tokens,
        )
    )


def _abort_connection(request: web.Request) -> None:
    """Cut the client's connection mid-response (fault injection or engine shutdown)."""
    if request.transport is not None:
        request.transport.close()
    raise _ConnectionAbortedError


def run(
    config: SimulatorConfig, *, host: str, port: int, ssl_context: ssl.SSLContext | None = None
) -> None:
    """Serve until SIGINT/SIGTERM (blocking); HTTPS with ``ssl_context``."""
    web.run_app(
        create_app(config),
        host=host,
        port=port,
        ssl_context=ssl_context,
        handler_cancellation=True,
        access_log=None,
        print=None,
        shutdown_timeout=5.0,
    )
