"""Micro-benchmark: a streamed response's head through uvicorn's ``send`` against
:func:`runtime.gateway.head_write.write_head` (issue #27).

``python -m bench.head_send_micro [--heads 20000] [--rounds 5]`` writes the router's stream head
(uvicorn's two default headers and 11 of the router's, as in :mod:`bench.head_write_micro`) to
an httptools ``RequestResponseCycle`` over a transport that keeps nothing, in one process:
``uvicorn send`` builds the ``http.response.start`` message and runs the cycle's ``send``
coroutine to its end; ``write_head`` calls the function. The rounds alternate A B B A, and
each reports CPU microseconds per head, one per request (``time.process_time``); run it
pinned (``taskset -c 0``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence

from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import RequestResponseCycle

from bench.head_write_micro import HEADERS
from bench.per_request_micro import ab
from runtime.gateway.head_write import write_head

DEFAULT_HEADERS = [(b"server", b"uvicorn"), (b"date", b"Fri, 27 Nov 2026 12:00:00 GMT")]


class _Transport:
    def write(self, data: bytes) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def _cycle() -> RequestResponseCycle:
    transport = _Transport()
    return RequestResponseCycle(
        scope={"method": "POST"},  # type: ignore[typeddict-item]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("bench"),
        access_logger=logging.getLogger("bench.access"),
        access_log=False,
        default_headers=DEFAULT_HEADERS,
        message_event=asyncio.Event(),
        expect_100_continue=False,
        keep_alive=True,
        on_response=lambda: None,
    )


def _uvicorn() -> Callable[[], None]:
    cycle = _cycle()

    def write() -> None:
        cycle.response_started = False
        cycle.chunked_encoding = None
        message = {"type": "http.response.start", "status": 200, "headers": list(HEADERS)}
        coro = cycle.send(message)  # type: ignore[arg-type]
        with contextlib.suppress(StopIteration):
            coro.send(None)

    return write


def _ours() -> Callable[[], None]:
    cycle = _cycle()

    def write() -> None:
        cycle.response_started = False
        cycle.chunked_encoding = None
        if not write_head(cycle, 200, list(HEADERS)):
            raise AssertionError("write_head declined the stream head")

    return write


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.head_send_micro")
    parser.add_argument("--heads", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    ab(args.heads, args.rounds, {"uvicorn send": _uvicorn(), "write_head": _ours()})


if __name__ == "__main__":
    main()
