"""What the chaos suite checks around a kill besides the requests: the router's Redis-down
signal (the metric an alert is built on) and a key revoked during the failure.

- :class:`FallbackWatch` samples the router's ``switchyard_admission_redis_fallback`` (1 while
  it admits on its local fallback limits) every 0.1 s, from before the kill until stopped. Each
  of the router's workers exports its own gauge, so a sample is the view of whichever worker
  answered the scrape (as Prometheus would see it).
- :class:`Revoker` is a ``manage.py shell`` against ``up``'s database and Redis: it issues a key
  for acme at once (published to routers like any change), revokes it when told, and exits.
- :func:`alert_for_s` reads an alert's ``for:`` from the shipped Prometheus rules.
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

import yaml
from fixtures.router import http_get, metric_value

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "platform" / "prometheus" / "rules.yml"
FALLBACK_METRIC = "switchyard_admission_redis_fallback"
FALLBACK_ALERT = "SwitchyardRouterRedisFallback"
SAMPLE_S = 0.1

_REVOKER = """
import sys
from apps.tenants.models import Tenant
from apps.tenants.services import api_key_create, api_key_revoke
key, full = api_key_create(actor=None, tenant=Tenant.objects.get(slug="acme"), name="chaos")
print("KEY", full, flush=True)
sys.stdin.readline()
api_key_revoke(actor=None, api_key=key)
print("REVOKED", flush=True)
"""


def alert_for_s(name: str) -> float:
    """The ``for:`` of alert ``name`` in platform/prometheus/rules.yml, in seconds."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == name:
                found = re.fullmatch(r"(\d+)([smh])", str(rule["for"]))
                assert found, rule["for"]
                return float(found.group(1)) * {"s": 1, "m": 60, "h": 3600}[found.group(2)]
    raise AssertionError(f"no alert {name} in {RULES}")


class FallbackWatch:
    """The router's fallback gauge over time: ``(time.monotonic(), value)`` samples."""

    def __init__(self, router: str) -> None:
        self.url = f"{router}/metrics"
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="chaos-fallback-watch")

    def __enter__(self) -> FallbackWatch:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10.0)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                status, body = http_get(self.url, timeout=2.0)
            except OSError:  # the router is busy or restarting: no sample
                status, body = 0, b""
            value = metric_value(body.decode(), FALLBACK_METRIC) if status == 200 else None
            if value is not None:
                self.samples.append((time.monotonic(), value))
            self._stop.wait(SAMPLE_S)

    def latest(self) -> float | None:
        return self.samples[-1][1] if self.samples else None

    def raised_s(self) -> float:
        """From the first sample reading 1 to the first reading 0 after it (or the last)."""
        ones = [t for t, v in self.samples if v == 1]
        if not ones:
            return 0.0
        after = [t for t, v in self.samples if v == 0 and t > ones[0]]
        return (after[0] if after else self.samples[-1][0]) - ones[0]


class Revoker:
    """A key of acme's issued now, revoked by :meth:`revoke` (see the module docstring)."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "shell", "-c", _REVOKER],
            cwd=REPO, env=dict(env), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        lines = []
        for line in self.proc.stdout:  # Django's start, then the key (or a traceback)
            lines.append(line)
            if line.startswith("KEY "):
                self.key = line.split()[1]
                return
        raise AssertionError("".join(lines)[-3000:])

    def revoke(self) -> None:
        """Tell it to revoke the key (it commits, then publishes or leaves it to the outbox)."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("revoke\n")
        self.proc.stdin.flush()

    def revoked(self) -> None:
        """Wait until it revoked the key and exited."""
        assert self.proc.stdout is not None
        out = self.proc.stdout.read()
        assert self.proc.wait(timeout=60) == 0, out[-3000:]
        assert "REVOKED" in out, out[-3000:]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def key_status(router: str, key: str) -> int:
    """The router's answer to ``GET /v1/models`` with ``key`` (200 valid, 401 refused)."""
    headers = {"Authorization": f"Bearer {key}"}
    request = urllib.request.Request(f"{router}/v1/models", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=3.0) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
