"""The device and batching flags of ``python -m runtime.workers.encoder`` and ``serve_encoder``."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any

from runtime.workers.encoder.batcher import BatchPolicy
from runtime.workers.encoder.model import DEVICES


def policy_arguments(parser: argparse.ArgumentParser) -> None:
    """The batching flags (shared with ``manage.py serve_encoder``)."""
    add = parser.add_argument
    add("--threads", type=int, default=1, help="torch threads (the cores this worker owns).")
    add("--max-batch", type=int, default=32, help="Batch size cap (default 32).")
    add("--max-wait-ms", type=float, default=10.0, help="Upper bound of the wait cap (ms).")
    add("--slo-ms", type=float, default=200.0, help="Class SLO when a request has no deadline.")
    add("--margin-ms", type=float, default=5.0, help="Safety margin before a deadline (ms).")
    add("--no-batching", action="store_true", help="Compute every input on its own, at once.")


def device_argument(parser: argparse.ArgumentParser) -> None:
    """``--device auto|cpu|cuda`` (shared with ``manage.py serve_encoder``)."""
    parser.add_argument(
        "--device",
        choices=DEVICES,
        default="auto",
        help="Where the model runs: auto (CUDA when torch sees a GPU, else CPU), cpu or cuda.",
    )


def policy_from(options: Mapping[str, Any]) -> BatchPolicy:
    """The :class:`BatchPolicy` of parsed :func:`policy_arguments` (raises ValueError)."""
    return BatchPolicy(
        max_batch=int(options["max_batch"]),
        max_wait_s=float(options["max_wait_ms"]) / 1000.0,
        slo_s=float(options["slo_ms"]) / 1000.0,
        margin_s=float(options["margin_ms"]) / 1000.0,
        enabled=not options["no_batching"],
    )
