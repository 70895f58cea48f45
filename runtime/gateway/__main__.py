"""``python -m runtime.gateway --host 127.0.0.1 --port 8080 [--workers N]``: run the router.

``--workers N`` > 1 runs N uvicorn worker processes on the one listening socket (fairness
counters, limits and credits are in Redis, so they stay global; the Redis-down fallback divides
each limit by replicas x workers: ``SWITCHYARD_ROUTER_WORKERS`` tells the workers N). Each
worker spools its settlements in a slot of its own (:mod:`runtime.metering.spool`) and dies
with the master (:func:`runtime.gateway.workers.worker_app`). N defaults to the cores available
to the process (:func:`runtime.gateway.workers.available_cores`: affinity and cgroup quota).
Their metrics are joined with prometheus_client's multiprocess mode: ``PROMETHEUS_MULTIPROC_DIR``
(default ``$SWITCHYARD_VAR_DIR/prometheus-<port>``) is emptied at start and handed to the
workers.

HTTPS: with ``SWITCHYARD_TLS_CERT`` and ``SWITCHYARD_TLS_KEY`` set (:mod:`runtime.tls`) the
router serves TLS on the same port (uvicorn's ssl path: the same protocol class under asyncio's
TLS transport); a certificate that is missing, expired or does not match its key refuses the
start with one line naming the variable and the file.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
from collections.abc import MutableMapping, Sequence
from pathlib import Path

import uvicorn

from runtime.gateway.config import ENV_WORKERS, ConfigError, RouterConfig, at_rest_keyring
from runtime.gateway.http_protocol import BoundedHttpToolsProtocol
from runtime.gateway.workers import available_cores
from runtime.telemetry.logging import logging_config
from runtime.tls import TLSConfigError, server_tls

WORKER_HEALTHCHECK_S = 30  # uvicorn's ping of each worker (whole seconds)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m runtime.gateway",
        description="Switchyard router: the OpenAI-compatible data plane (uvicorn, uvloop, "
        "httptools). Settings come from the environment (see runtime/gateway/config.py).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (%(default)s)")
    parser.add_argument("--port", type=int, default=8080, help="port to bind (%(default)s)")
    parser.add_argument(
        "--workers",
        type=int,
        default=None,
        help="processes (default: the cores available to this process, cgroup quota included)",
    )
    parser.add_argument("--log-level", default="info", help="log level (%(default)s)")
    parser.add_argument(
        "--graceful-shutdown-s",
        type=float,
        default=30.0,
        help="on SIGTERM, let in-flight streams finish this long (%(default)s)",
    )
    return parser


def prepare_multiprocess_metrics(
    workers: int, port: int, env: MutableMapping[str, str]
) -> Path | None:
    """With several workers (or a ``PROMETHEUS_MULTIPROC_DIR`` given), an empty metrics
    directory for this router, set in ``env`` for the workers; None for one plain worker."""
    given = env.get("PROMETHEUS_MULTIPROC_DIR")
    if workers == 1 and not given:
        return None
    var_dir = Path(env.get("SWITCHYARD_VAR_DIR") or "var")
    directory = Path(given) if given else var_dir / f"prometheus-{port}"
    shutil.rmtree(directory, ignore_errors=True)  # a previous run's dead workers' files
    directory.mkdir(parents=True, exist_ok=True)
    env["PROMETHEUS_MULTIPROC_DIR"] = str(directory.resolve())
    return directory


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    workers = available_cores() if args.workers is None else args.workers
    if workers < 1:
        raise SystemExit("--workers must be >= 1")
    os.environ[ENV_WORKERS] = str(workers)  # read by the workers' RouterConfig
    try:
        tls = server_tls(os.environ)
        if tls is not None:
            tls.context()  # checks it now: one clear line instead of a worker's traceback
    except TLSConfigError as exc:
        raise SystemExit(f"router: {exc}") from None
    prepare_multiprocess_metrics(workers, args.port, os.environ)
    try:  # before the workers: a bad key setting stops here; a missing keys file is made once
        at_rest_keyring(RouterConfig.from_env())
    except ConfigError as exc:
        raise SystemExit(f"router: {exc}") from None
    uvicorn.run(
        "runtime.gateway.workers:worker_app" if workers > 1 else "runtime.gateway.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=workers,
        # A worker answers the master's health ping only once its imports are done: 3-5 s on
        # a loaded 2-core machine, past uvicorn's 5 s, which then killed and restarted every
        # new worker in a loop. A hung worker is replaced this much later instead.
        timeout_worker_healthcheck=WORKER_HEALTHCHECK_S,
        loop="uvloop",
        http=BoundedHttpToolsProtocol,  # httptools, with a bounded request head
        lifespan="on",
        access_log=False,
        proxy_headers=False,  # the router reads no client address: skip the middleware
        log_config=logging_config(args.log_level.upper()),
        # whole seconds (uvicorn's type); rounded up so that 0.5 does not become no grace
        timeout_graceful_shutdown=math.ceil(args.graceful_shutdown_s),
        ssl_certfile=None if tls is None else str(tls.cert),
        ssl_keyfile=None if tls is None else str(tls.key),
    )


if __name__ == "__main__":
    main()
