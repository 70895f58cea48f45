"""A raw-socket corpus against a real router: malformed request lines, oversized heads, bad
framing, truncated and stalled bodies. Every answer is below 500 (an OpenAI error document
where the router answers at all) and every connection ends within a bound: no hang.
"""

from __future__ import annotations

import contextlib
import json
import socket
import time

import pytest
from fuzz_target import BODY_TIMEOUT_S, CHAT_MODEL, Target

pytestmark = pytest.mark.integration

READ_BOUND_S = BODY_TIMEOUT_S + 5.0
CHAT = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
BODY = json.dumps(
    {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
).encode()


BAD_UTF8 = b'{"model": "\xc3\x28", "messages": [{"role": "user", "content": "x"}]}'


def with_key(target: Target, head: bytes) -> bytes:
    return head + f"Authorization: Bearer {target.key}\r\n".encode()


def corpus(target: Target) -> dict[str, tuple[bytes, bool, set[int] | None]]:
    """name -> (bytes to send, close our write side after, the statuses allowed or None for
    "any status below 500, or none")."""
    auth = with_key(target, CHAT)
    big = b"a" * 100_000
    return {
        "garbage": (b"GARBAGE\r\n\r\n", False, {400}),
        "binary_noise": (bytes(range(256)) * 4, False, {400}),
        "bad_version": (b"GET /healthz HTTP/9.9\r\n\r\n", False, None),
        # llhttp reads a request line without a version as HTTP/0.9
        "no_version": (b"GET /healthz\r\n\r\n", False, None),
        "long_request_line": (b"GET /" + big + b" HTTP/1.1\r\nHost: x\r\n\r\n", False, {431}),
        "huge_header": (CHAT + b"X-Big: " + big + b"\r\n\r\n", False, {431}),
        "many_headers": (CHAT + b"X-A: bbbbbbbbbbbbbbbbbbbbbbb\r\n" * 4000 + b"\r\n", False, {431}),
        "header_without_colon": (CHAT + b"Broken header\r\n\r\n", False, {400}),
        "nul_in_header": (CHAT + b"X-A: a\x00b\r\n\r\n", False, {400}),
        "non_latin_header": (
            auth + b"X-Request-Timeout: \xff\r\nContent-Length: " + f"{len(BODY)}".encode()
            + b"\r\n\r\n" + BODY, False, {400},
        ),
        "bad_content_length": (CHAT + b"Content-Length: abc\r\n\r\n", False, {400}),
        "negative_content_length": (CHAT + b"Content-Length: -5\r\n\r\n", False, {400}),
        "two_content_lengths": (
            CHAT + b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}", False, {400}
        ),
        "length_and_chunked": (
            CHAT + b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", False,
            {400},
        ),
        "bad_chunk_size": (
            auth + b"Transfer-Encoding: chunked\r\n\r\nZZ\r\nabc\r\n0\r\n\r\n", False, {400}
        ),
        "chunk_longer_than_said": (
            auth + b"Transfer-Encoding: chunked\r\n\r\n2\r\nabcdef\r\n0\r\n\r\n", False, {400}
        ),
        "truncated_body_stalls": (
            auth + b"Content-Length: 100\r\n\r\n" + BODY[:10], False, {408}
        ),
        "truncated_chunked_stalls": (
            auth + b"Transfer-Encoding: chunked\r\n\r\n5\r\nab", False, {408}
        ),
        "head_stalls": (CHAT + b"X-Partial: yes", False, {408}),
        "silence": (b"", False, {408}),
        "truncated_body_then_close": (
            auth + b"Content-Length: 100\r\n\r\n" + BODY[:10], True, None
        ),
        "invalid_utf8_body": (
            auth + f"Content-Length: {len(BAD_UTF8)}\r\n\r\n".encode() + BAD_UTF8, False, {400}
        ),
        "body_shorter_than_length_complete": (
            auth + f"Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY, False, {200}
        ),
        "pipelined_garbage_after_a_good_request": (
            auth + f"Content-Length: {len(BODY)}\r\n\r\n".encode() + BODY + b"NOT HTTP\r\n\r\n",
            False,
            {200, 400},  # all in one read: the parser's 400 may come first
        ),
    }  # fmt: skip


def exchange(port: int, payload: bytes, *, close_write: bool) -> tuple[bytes, float]:
    """Send ``payload``; read until the server closes or READ_BOUND_S passes (a hang)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=READ_BOUND_S) as sock:
        with contextlib.suppress(OSError):  # a refusal (431) may close while we still send
            sock.sendall(payload)
        if close_write:
            sock.shutdown(socket.SHUT_WR)
        received = b""
        while time.monotonic() - started < READ_BOUND_S:
            try:
                data = sock.recv(65536)
            except TimeoutError:
                break
            except OSError:
                break  # reset by the server after a refusal
            if not data:
                return received, time.monotonic() - started
            received += data
            if _complete(received):
                return received, time.monotonic() - started
    raise AssertionError(f"no end within {READ_BOUND_S} s; got {received[:300]!r}")


def _complete(received: bytes) -> bool:
    """One whole response with a Content-Length has arrived (keep-alive may hold the line)."""
    head, sep, body = received.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


def statuses(received: bytes) -> list[int]:
    lines = received.split(b"\r\n")
    return [int(line.split()[1]) for line in lines if line.startswith(b"HTTP/1.")]


def test_raw_socket_corpus(target: Target) -> None:
    failures = []
    for name, (payload, close_write, allowed) in corpus(target).items():
        received, took = exchange(target.port, payload, close_write=close_write)
        codes = statuses(received)
        if any(code >= 500 for code in codes):
            failures.append(f"{name}: {codes} {received[:300]!r}")
        elif allowed is not None and (not codes or codes[0] not in allowed):
            failures.append(f"{name}: expected {allowed}, got {codes} {received[:300]!r}")
        elif codes and codes[0] >= 400:
            body = received.partition(b"\r\n\r\n")[2]
            error = json.loads(body)["error"]
            if set(error) != {"message", "type", "param", "code"}:
                failures.append(f"{name}: not an OpenAI error: {body[:300]!r}")
        if codes and codes[0] == 408 and took > BODY_TIMEOUT_S + 3:
            failures.append(f"{name}: 408 after {took:.1f} s")
    assert not failures, "\n".join(failures)
    assert "Traceback" not in target.router.output()
