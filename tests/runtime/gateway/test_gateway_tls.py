"""The router over HTTPS and the router -> worker hop over mutual TLS, with real processes.

One local CA (``config.tls``, what ``switchyard up --tls`` makes); a simulator worker serving
HTTPS that requires client certificates (vLLM's flags: ``--ssl-cert-reqs 2``); a router
(``python -m runtime.gateway``: uvicorn's ssl path with our httptools protocol class) serving
HTTPS and calling the worker with its client certificate. The unmodified ``openai`` client
trusts the CA through ``httpx``; streaming works; a client without a certificate is refused
by the worker, and the router's upstream client says so in one sentence; SIGTERM still lets
an in-flight stream finish under TLS.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
from fixtures.net import port_accepts
from fixtures.router import Process, spawn
from fixtures.wait import eventually
from gateway_fleet import Publisher, World, redis_url

from config.tls import LocalPKI, ensure_local_pki, up_environ
from runtime import tls
from runtime.upstream import ConnectFailed, ConnectionDropped, UpstreamClient
from runtime.upstream.client import ClientConfig

pytestmark = pytest.mark.integration

MODEL = "tls-chat"
START_S = 60.0


@dataclass
class Secured:
    pki: LocalPKI
    sim: Process
    router: Process
    key: str

    @property
    def sim_url(self) -> str:
        return f"https://127.0.0.1:{self.sim.port}"

    @property
    def router_url(self) -> str:
        return f"https://localhost:{self.router.port}"


def _answers(url: str, *, verify: ssl.SSLContext) -> bool:
    try:
        return httpx.get(url, verify=verify, timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def _client(pki: LocalPKI, *, cert: bool) -> ssl.SSLContext:
    """httpx's verify=: the CA, and with ``cert`` the client certificate (mTLS)."""
    if cert:
        return tls.ClientTLS(ca=pki.ca, cert=pki.cert, key=pki.key).context()
    return tls.ClientTLS(ca=pki.ca).context()


def _started(process: Process, url: str, pki: LocalPKI, *, cert: bool = False) -> Process:
    context = _client(pki, cert=cert)
    try:
        eventually(
            lambda: process.alive() and _answers(url, verify=context),
            timeout=START_S, interval=0.1, what=url,
        )  # fmt: skip
        assert process.alive()
    except AssertionError:
        output = process.output()[-3000:]
        process.stop()
        raise AssertionError(f"{url} never answered:\n{output}") from None
    return process


def _start_router(pki: LocalPKI, prefix: str, var: Path) -> Process:
    env = {
        **os.environ,
        **up_environ(pki, {}, web_port=1, router_port=2),
        "REDIS_URL": redis_url(),
        "SWITCHYARD_SNAPSHOT_PREFIX": prefix,
        "SWITCHYARD_VAR_DIR": str(var),
        "SWITCHYARD_KEY_USAGE_HASH": f"{prefix}:apikey:last_used",
    }
    router, port = spawn(
        ["runtime.gateway", "--workers", "1", "--graceful-shutdown-s", "10"], env=env
    )
    return _started(router, f"https://127.0.0.1:{port}/healthz", pki)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    var = tmp_path_factory.mktemp("tls-var")
    pki, _ = ensure_local_pki(var)
    mtls = ["--ssl-certfile", str(pki.cert), "--ssl-keyfile", str(pki.key),
            "--ssl-ca-certs", str(pki.ca), "--ssl-cert-reqs", "2"]  # fmt: skip
    sim, port = spawn(
        ["runtime.workers.simulator", "--model", MODEL, "--log-level", "WARNING",
         "--decode-a-ms", "20", "--decode-b-ms", "0", *mtls]
    )  # fmt: skip
    _started(sim, f"https://127.0.0.1:{port}/health", pki, cert=True)
    publisher = Publisher(f"switchyard:test:gw-tls:{uuid.uuid4().hex[:8]}")
    world = World()
    world.add_model(MODEL, 1)
    world.add_endpoint(1, 1, f"https://127.0.0.1:{port}")
    world.add_tenant("acme")
    key = world.add_key("k", "acme")
    router: Process | None = None
    try:
        router = _start_router(pki, publisher.prefix, var)
        version = publisher.publish(world.snapshot())

        def serving() -> bool:
            body = httpx.get(
                f"https://127.0.0.1:{router.port}/readyz", verify=_client(pki, cert=False)
            )
            return body.status_code == 200 and body.json()["snapshot_version"] >= version

        eventually(serving, timeout=20, interval=0.05, what="router serves the snapshot",
                   ignore=(httpx.HTTPError,))  # fmt: skip
        yield Secured(pki=pki, sim=sim, router=router, key=key)
    finally:
        if router is not None:
            router.stop()
        sim.stop()
        publisher.cleanup()


def test_openai_client_over_https_unary_and_streaming(secured: Secured) -> None:
    with httpx.Client(verify=_client(secured.pki, cert=False)) as http:
        client = openai.OpenAI(
            base_url=f"{secured.router_url}/v1", api_key=secured.key, http_client=http
        )
        done = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert done.choices[0].finish_reason == "length"
        assert done.usage is not None
        assert done.usage.completion_tokens == 4
        stream = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=6,
            stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.completion_tokens == 6


def test_plain_http_and_untrusted_clients_get_no_answer(secured: Secured) -> None:
    with pytest.raises(httpx.TransportError):  # plain HTTP to the TLS port
        httpx.get(f"http://127.0.0.1:{secured.router.port}/healthz", timeout=5)
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(f"{secured.router_url}/healthz", timeout=5)  # the system CAs only


def test_our_protocol_class_refuses_an_oversized_head_over_tls(secured: Secured) -> None:
    """The bounded httptools protocol runs under asyncio's TLS transport too."""
    resp = httpx.get(
        f"{secured.router_url}/healthz", headers={"x-big": "a" * (70 * 1024)},
        verify=_client(secured.pki, cert=False), timeout=5,
    )  # fmt: skip
    assert resp.status_code == 431
    assert resp.json()["error"]["code"] == "headers_too_large"


def test_the_worker_refuses_a_client_without_a_certificate(secured: Secured) -> None:
    with_cert = _client(secured.pki, cert=True)
    assert httpx.get(f"{secured.sim_url}/health", verify=with_cert).status_code == 200
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{secured.sim_url}/health", verify=_client(secured.pki, cert=False), timeout=5)


@pytest.mark.asyncio
async def test_the_routers_upstream_client_names_the_tls_failure(secured: Secured) -> None:
    pki = secured.pki
    cases = {
        "with its certificate": tls.ClientTLS(ca=pki.ca, cert=pki.cert, key=pki.key),
        "without a certificate": tls.ClientTLS(ca=pki.ca),
        "without the CA": tls.ClientTLS(),
    }
    seen: dict[str, str] = {}
    for name, client_tls in cases.items():
        client = UpstreamClient(ClientConfig(tls=client_tls.context()))
        try:
            status, _ = await client.probe(secured.sim_url, "/health", timeout_s=5)
            seen[name] = str(status)
        except (ConnectFailed, ConnectionDropped) as exc:
            seen[name] = str(exc)
        finally:
            await client.close()
    assert seen["with its certificate"] == "200"
    # TLS 1.3: the worker checks the client's certificate after the handshake and hangs up
    # (TLS 1.2 refuses in the handshake: "TLS handshake with the worker failed ...").
    assert seen["without a certificate"].startswith("TLS")
    assert "SWITCHYARD_UPSTREAM_TLS_CERT" in seen["without a certificate"]
    assert seen["without the CA"].startswith("TLS: the worker 127.0.0.1:")
    assert "certificate we do not trust" in seen["without the CA"]


def test_sigterm_lets_an_in_flight_tls_stream_finish(secured: Secured, tmp_path: Path) -> None:
    """A router of its own (this one is stopped), same worker and snapshot."""
    publisher = Publisher(f"switchyard:test:gw-tls-drain:{uuid.uuid4().hex[:8]}")
    world = World()
    world.add_model(MODEL, 1)
    world.add_endpoint(1, 1, secured.sim_url)
    world.add_tenant("acme")
    key = world.add_key("k", "acme")
    version = publisher.publish(world.snapshot())
    router = _start_router(secured.pki, publisher.prefix, tmp_path)
    lines: list[str] = []
    try:
        url = f"https://127.0.0.1:{router.port}"
        ca = _client(secured.pki, cert=False)
        eventually(
            lambda: httpx.get(f"{url}/readyz", verify=ca).json()["snapshot_version"] >= version,
            timeout=20, interval=0.05, what="drain router ready", ignore=(httpx.HTTPError,),
        )  # fmt: skip
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 40, "stream": True}  # fmt: skip
        with httpx.stream(
            "POST", f"{url}/v1/chat/completions", json=body, verify=ca, timeout=30,
            headers={"Authorization": f"Bearer {key}"},
        ) as resp:  # fmt: skip
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    lines.append(line[6:])
                    if len(lines) == 1:
                        router.proc.send_signal(signal.SIGTERM)
        assert router.proc.wait(timeout=20) in (0, -signal.SIGTERM), router.output()[-3000:]
        assert "Application shutdown complete" in router.output()
    finally:
        router.stop()
        publisher.cleanup()
    assert lines[-1] == "[DONE]", lines[-3:]
    finals = [json.loads(line) for line in lines[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in finals if c["choices"]][-1] == "length"
    assert not port_accepts(router.port)
