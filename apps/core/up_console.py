"""What ``manage.py up`` prints: the banner with ready-to-paste examples, and the "ready" lines.

The readiness probes run in a background thread of ``up``: the control plane's login page, the
router's ``/readyz``, and for the demo model what the line claims: the snapshot the router serves
holds an endpoint of the demo pool in state ``ready`` (the autoscaler started it; never a stale
record alone) AND the model answers a real one-token chat completion — through the router with
the demo API key when this run printed one, else at that replica itself (later runs do not know
a key). Nothing here imports
Django settings: ``up``'s own settings were read before the embedded servers existed, so every
address comes in as an argument.
"""

from __future__ import annotations

import contextlib
import json
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import msgspec
import redis
from redis.exceptions import RedisError

from runtime import redis_conn, snapshot_store

DEMO_MODEL = "demo-llama"
POLL_S = 0.5


def without_password(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


@dataclass(frozen=True, kw_only=True)
class Addresses:
    web: str  # http://127.0.0.1:8000 (https:// under TLS)
    router: str  # http://127.0.0.1:8080
    pool: str | None  # the demo model's pool the autoscaler serves; None with --no-worker
    ca: str | None = None  # `up --tls`: the local CA's file, for the examples
    tls: ssl.SSLContext | None = None  # the checks' client context (CA, client certificate)


def try_it(router: str, key: str, ca: str | None = None) -> list[str]:
    """A curl (SSE) and a Python openai example against ``router`` with ``key`` (trusting
    the CA file ``ca`` when given)."""
    cacert = f"--cacert {ca} " if ca else ""
    python = f"SSL_CERT_FILE={ca} .venv/bin/python" if ca else ".venv/bin/python"
    body = json.dumps(
        {
            "model": DEMO_MODEL,
            "messages": [{"role": "user", "content": "Hello!"}],
            "max_tokens": 32,
            "stream": True,
        }
    )
    return [
        "  Try it once the model is ready (streams tokens; the demo model's weights are random):",
        "",
        f"    curl -N {cacert}{router}/v1/chat/completions \\",
        f'      -H "Authorization: Bearer {key}" \\',
        '      -H "Content-Type: application/json" \\',
        f"      -d '{body}'",
        "",
        f"    {python} - <<'EOF'",
        "    from openai import OpenAI",
        f'    client = OpenAI(base_url="{router}/v1", api_key="{key}")',
        "    stream = client.chat.completions.create(",
        f'        model="{DEMO_MODEL}", messages=[{{"role": "user", "content": "Hello!"}}],',
        '        max_tokens=32, stream=True, stream_options={"include_usage": True})',
        "    for chunk in stream:",
        "        if chunk.choices:",
        '            print(chunk.choices[0].delta.content or "", end="", flush=True)',
        "        if chunk.usage:",
        '            print(f"\\n{chunk.usage}")',
        "    EOF",
    ]


def banner(
    env: Mapping[str, str], *, at: Addresses, seed: Mapping[str, Any], worker_log: str
) -> str:
    lines = [
        "Switchyard",
        f"  dashboard        {at.web}/dashboard/",
        f"  admin            {at.web}/admin/",
        f"  OpenAPI schema   {at.web}/api/schema/",
        f"  router (OpenAI)  {at.router}/v1",
        f"  model replicas   started by the autoscaler ({DEMO_MODEL} in pool {at.pool}, "
        f"min 1 / max 2; logs {worker_log})"
        if at.pool
        else "  model replicas   not started (--no-worker: autoscaling off)",
        f"  PostgreSQL       {without_password(env['DATABASE_URL'])}",
        f"  Redis            {without_password(env['REDIS_URL'])}",
        f"  data             {env['SWITCHYARD_VAR_DIR']}",
    ]
    if seed.get("operator_password"):
        lines += [
            "",
            "  Shown once, not stored in clear anywhere: write them down now.",
            f"  operator login   {seed['operator_username']} / {seed['operator_password']}",
        ]
        lines += [f"  API key {slug:<8} {key}" for slug, key in seed["api_keys"].items()]
        acme = seed["api_keys"].get("acme")
        if acme and at.pool:
            lines += ["", *try_it(at.router, acme, at.ca)]
    else:
        lines += [
            "",
            f"  demo data from an earlier run (operator login: {seed['operator_username']});",
            "  its password and API keys were shown then. Make new keys in the admin.",
            "  README.md, 'Try it', has curl and Python examples for the router.",
        ]
    lines += ["", "  Ctrl-C stops every process."]
    rule = "=" * 72
    return "\n".join([rule, *lines, rule])


# --- readiness ------------------------------------------------------------------------------


def http_json(
    url: str, *, timeout: float = 2.0, context: ssl.SSLContext | None = None
) -> tuple[int, Any]:
    """(status, parsed JSON or None); (0, None) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as response:  # noqa: S310
            raw = response.read()
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code, None
    except (urllib.error.URLError, OSError):
        return 0, None
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, None


def serving_endpoint(
    client: redis.Redis[bytes], *, prefix: str, pool: str
) -> tuple[int, str] | None:
    """(the published snapshot's version, the endpoint's URL) if it holds a ready endpoint in
    ``pool``, else None."""
    try:
        snapshot = snapshot_store.read_latest(client, prefix=prefix)
    except (RedisError, OSError, msgspec.MsgspecError):
        return None
    if snapshot is None:
        return None
    for endpoint in sorted(snapshot.endpoints.values(), key=lambda e: e.id):
        if endpoint.pool == pool and endpoint.state == "ready":
            return snapshot.version, endpoint.base_url
    return None


def answers(
    url: str,
    *,
    model: str,
    api_key: str | None = None,
    timeout: float = 30.0,
    context: ssl.SSLContext | None = None,
) -> bool:
    """Whether ``POST url`` (a chat completions URL) answers a one-token request with 200."""
    body = {"model": model, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 1}
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(  # noqa: S310 - http only
        url, data=json.dumps(body).encode(), headers=headers, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:  # noqa: S310
            response.read()
            return int(response.status) == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


@dataclass(frozen=True, kw_only=True)
class ReadyCheck:
    probe: Callable[[], bool]
    ready: str  # printed once the probe succeeds
    late: str  # printed if it has not within timeout_s
    timeout_s: float


def checks(
    at: Addresses, *, redis_url: str, snapshot_prefix: str, api_key: str | None = None
) -> tuple[list[ReadyCheck], Callable[[], None]]:
    """The checks ``up`` announces, and a function that releases what they hold."""
    holder: list[redis.Redis[bytes]] = []

    def web() -> bool:
        return http_json(f"{at.web}/admin/login/", context=at.tls)[0] == 200

    def router() -> bool:
        return http_json(f"{at.router}/readyz", context=at.tls)[0] == 200

    def model() -> bool:
        if not holder:
            holder.append(
                redis_conn.from_url(redis_url, socket_timeout=2, socket_connect_timeout=2)
            )
        assert at.pool is not None
        found = serving_endpoint(holder[0], prefix=snapshot_prefix, pool=at.pool)
        if found is None:
            return False
        version, replica = found
        status, body = http_json(f"{at.router}/readyz", context=at.tls)
        served = body.get("snapshot_version") if isinstance(body, dict) else None
        if status != 200 or not isinstance(served, int) or served < version:
            return False
        if api_key:  # the claim itself: the model answers through the router
            return answers(
                f"{at.router}/v1/chat/completions",
                model=DEMO_MODEL,
                api_key=api_key,
                context=at.tls,
            )
        return answers(f"{replica}/v1/chat/completions", model=DEMO_MODEL, context=at.tls)

    found = [
        ReadyCheck(
            probe=web,
            ready=f"ready: {at.web}/admin/",
            late=f"the control plane does not answer at {at.web} yet; see the web lines above",
            timeout_s=120.0,
        ),
        ReadyCheck(
            probe=router,
            ready=f"router ready: {at.router}/v1",
            late=f"the router is not ready at {at.router} yet; see the router lines above",
            timeout_s=120.0,
        ),
    ]
    if at.pool is not None:
        found.append(
            ReadyCheck(
                probe=model,
                ready=f"model ready: {DEMO_MODEL} (pool {at.pool}) answered a request "
                + (
                    f"through the router at {at.router}/v1"
                    if api_key
                    else f"and the router at {at.router}/v1 routes to it"
                ),
                late=f"{DEMO_MODEL} does not serve yet; see the scaling lines above (worker) "
                "and the replica logs",
                timeout_s=900.0,
            )
        )

    def close() -> None:
        for client in holder:
            with contextlib.suppress(RedisError, OSError):
                client.close()

    return found, close


def announce_ready(
    pending: list[ReadyCheck], note: Callable[[str], None], stop: threading.Event
) -> None:
    """Poll every check until each succeeded or timed out, or ``stop`` is set."""
    started = time.monotonic()
    while pending and not stop.wait(POLL_S):
        for check in list(pending):
            if check.probe():
                note(f"{check.ready} (after {time.monotonic() - started:.0f} s)")
                pending.remove(check)
            elif time.monotonic() - started > check.timeout_s:
                note(check.late)
                pending.remove(check)
