"""``python -m runtime.workers.encoder``: one encoder replica without the registry.

For tests and benchmarks: serves ``--artifact-dir`` as ``--model`` on ``--port``, verifying it
against ``--digest`` when given. ``manage.py serve_encoder`` is the registered, heartbeated way.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from pathlib import Path

from runtime.tls import TLSConfigError, worker_tls
from runtime.workers.encoder.options import device_argument, policy_arguments, policy_from
from runtime.workers.encoder.worker import EncoderSpec, EncoderWorker
from runtime.workers.replica import WorkerError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runtime.workers.encoder")
    parser.add_argument("--artifact-dir", type=Path, required=True)
    parser.add_argument("--model", required=True, help="The model name clients send.")
    parser.add_argument(
        "--alias", action="append", default=[], help="Another model name to answer to."
    )
    parser.add_argument("--digest", default=None, help="Expected artifact digest (verified).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--grace", type=float, default=30.0)
    device_argument(parser)
    policy_arguments(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=os.environ.get("SWITCHYARD_LOG_LEVEL", "INFO"))
    try:
        policy = policy_from(vars(args))
        tls = worker_tls(os.environ)  # SWITCHYARD_WORKER_TLS_*: HTTPS, mTLS with a client CA
    except (ValueError, TLSConfigError) as exc:
        parser.error(str(exc))
    spec = EncoderSpec(
        artifact_dir=args.artifact_dir,
        expected_digest=args.digest,
        model_name=args.model,
        aliases=tuple(args.alias),
        host=args.host,
        port=args.port,
        threads=args.threads,
        device=args.device,
        policy=policy,
        grace_s=args.grace,
        tls=tls,
    )
    try:
        asyncio.run(EncoderWorker(spec).run())
    except WorkerError as exc:
        print(f"error: {exc}", file=sys.stderr)  # noqa: T201
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
