"""``python -m runtime.gateway --host 127.0.0.1 --port 8080 [--workers N]``: run the router."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import uvicorn

from runtime.gateway.http_protocol import BoundedHttpToolsProtocol
from runtime.telemetry.logging import logging_config


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m runtime.gateway",
        description="Switchyard router: the OpenAI-compatible data plane (uvicorn, uvloop, "
        "httptools). Settings come from the environment (see runtime/gateway/config.py).",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (%(default)s)")
    parser.add_argument("--port", type=int, default=8080, help="port to bind (%(default)s)")
    parser.add_argument("--workers", type=int, default=1, help="processes (%(default)s)")
    parser.add_argument("--log-level", default="info", help="log level (%(default)s)")
    parser.add_argument(
        "--graceful-shutdown-s",
        type=float,
        default=30.0,
        help="on SIGTERM, let in-flight streams finish this long (%(default)s)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    if args.workers < 1:
        raise SystemExit("--workers must be >= 1")
    uvicorn.run(
        "runtime.gateway.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        loop="uvloop",
        http=BoundedHttpToolsProtocol,  # httptools, with a bounded request head
        lifespan="on",
        access_log=False,
        log_config=logging_config(args.log_level.upper()),
        timeout_graceful_shutdown=int(args.graceful_shutdown_s),
    )


if __name__ == "__main__":
    main()
