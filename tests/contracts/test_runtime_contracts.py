"""The data plane's single points, enforced (issue 27, must-have 5), and each check shown to fail
when its rule is broken.

- Imports (import-linter, ``runtime_contracts.ini``): ``runtime`` never imports the control plane
  (``apps``, ``config``, ``frontend``); only ``runtime.gateway`` imports Django, and only
  ``django.conf``; ``aiohttp`` only in ``runtime.upstream``, ``runtime.workers`` and ``bench``.
- Sources (``source_rules.py``, on the syntax tree) in ``runtime/`` and ``frontend/``: Redis
  clients are built only by ``runtime/redis_conn.py``; Redis key names are spelled only in
  ``runtime/contract.py``.

Allow-list entries name a violation another change owns and why; one whose violation is gone is
reported (warning) so it can be deleted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from source_rules import Finding, check_source, check_tree

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
CONFIG = Path(__file__).with_name("runtime_contracts.ini")
ROOT_PACKAGES = ("runtime", "frontend", "apps", "config", "bench")
SCANNED = ("runtime", "frontend")
OWN_JOB = {"runtime/contract.py": "redis-key", "runtime/redis_conn.py": "redis-client"}

# (path, rule) -> why it is still there. Shrinks only.
ALLOWED: dict[tuple[str, str], str] = {}

_LINT = (
    "import sys; from importlinter.cli import lint_imports_command; "
    "sys.exit(lint_imports_command())"
)


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """import-linter with our contracts over the packages under ``root`` (a fresh process, so
    ``root``'s packages are the ones analysed)."""
    env = {**os.environ, "PYTHONPATH": str(root), "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-c", _LINT, "--config", str(CONFIG), "--no-cache"],
        cwd=root, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_the_import_contracts_hold() -> None:
    result = lint_imports(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 3 kept, 0 broken." in result.stdout


def _copy_python_tree(dst: Path) -> None:
    def not_python(folder: str, names: list[str]) -> set[str]:
        return {
            n for n in names
            if n == "__pycache__" or (not n.endswith(".py") and not (Path(folder) / n).is_dir())
        }  # fmt: skip

    for package in ROOT_PACKAGES:
        shutil.copytree(REPO / package, dst / package, ignore=not_python)


PROBES = {
    # module under the copied tree -> (its source, the violation import-linter must report)
    "runtime/routing/_probe_apps.py": (
        "from apps.tenants import models\n",
        "runtime.routing._probe_apps -> apps.tenants.models",
    ),
    "runtime/telemetry/_probe_frontend.py": (
        "import frontend.access\n",
        "runtime.telemetry._probe_frontend -> frontend.access",
    ),
    "runtime/scaling/_probe_django.py": (
        "from django.conf import settings\n",
        "runtime.scaling._probe_django -> django.conf",
    ),
    "runtime/gateway/_probe_django_db.py": (
        "from django.db import connection\n",
        "runtime.gateway._probe_django_db -> django.db",
    ),
    "runtime/scaling/_probe_aiohttp.py": (
        "import aiohttp\n",
        "runtime.scaling._probe_aiohttp -> aiohttp",
    ),
    "frontend/_probe_aiohttp.py": (
        "from aiohttp import web\n",
        "frontend._probe_aiohttp -> aiohttp",
    ),
}


def test_each_import_contract_fails_when_broken(tmp_path: Path) -> None:
    _copy_python_tree(tmp_path)
    for rel, (source, _) in PROBES.items():
        (tmp_path / rel).write_text(source, encoding="utf-8")
    result = lint_imports(tmp_path)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    assert "Contracts: 0 kept, 3 broken." in out, out
    for _, violation in PROBES.values():
        assert violation in out, f"not reported: {violation}\n{out}"
    # what the gateway may import is not reported
    assert "runtime.gateway.channels_http -> django.conf" not in out


def _unallowed(findings: list[Finding], rule: str) -> list[str]:
    found = [f for f in findings if f.rule == rule]
    stale = {k for k in ALLOWED if k[1] == rule} - {(f.path, f.rule) for f in found}
    for path, _ in sorted(stale):
        warnings.warn(f"allow-list entry ({path}, {rule}) matches nothing: delete it", stacklevel=2)
    return [str(f) for f in found if (f.path, f.rule) not in ALLOWED]


@pytest.fixture(scope="module")
def repo_findings() -> list[Finding]:
    return check_tree(REPO, SCANNED, exempt=OWN_JOB)


def test_redis_clients_come_only_from_redis_conn(repo_findings: list[Finding]) -> None:
    assert _unallowed(repo_findings, "redis-client") == []


def test_redis_key_names_are_spelled_only_in_contract(repo_findings: list[Finding]) -> None:
    assert _unallowed(repo_findings, "redis-key") == []


@pytest.mark.parametrize(
    ("source", "rule"),
    [
        ("client = aioredis.Redis.from_url(url)", "redis-client"),
        ("client = redis.Redis(host='h', port=1)", "redis-client"),
        ("client = StrictRedis()", "redis-client"),
        ("from redis.asyncio import Redis as R\nc = R.from_url(u)", "redis-client"),
        ("pool = redis.ConnectionPool.from_url(u)", "redis-client"),
        ("c = redis.asyncio.RedisCluster(host='h')", "redis-client"),
        ("c = aioredis.Redis.from_pool(pool)", "redis-client"),
        ("key = f'{ns}:live'", "redis-key"),
        ("key = f'{self._ns}:cache:e:{scope}'", "redis-key"),
        ("key = f'{ns}:vstats:{model}|{version}:{bucket}'", "redis-key"),
        ("key = ns + ':limits'", "redis-key"),
        ("key = '{}:live:relay'.format(ns)", "redis-key"),
        ("key = '%s:dash:tasks' % ns", "redis-key"),
        ("key = 'switchyard:usage'", "redis-key"),
        ("key = ':'.join((ns, 'live', 'recent'))", "redis-key"),
        ("def f():\n    return client.get(f'{namespace}:ledger-lock')", "redis-key"),
    ],
)
def test_the_source_rules_find_a_violation(source: str, rule: str) -> None:
    assert [f.rule for f in check_source(source)] == [rule]


@pytest.mark.parametrize(
    "source",
    [
        "url = f'http://{host}:{port}/metrics'",
        "addr = f'{host}:{port}'",
        "msg = f'{name}: failed'",
        "entry = f'{grant}:r{i}'",  # an entry id, not a name under ``grant``
        "metric = 'vllm:num_requests_running'",
        "when = f'{t:%H:%M}'",
        "def f():\n    '''Writes ``switchyard:snapshot:latest``.'''",
        "client = async_client(url, name='x')",
        "import redis\nredis.exceptions.ConnectionError",
        "addr = ':'.join([host, str(port)])",
    ],
)
def test_the_source_rules_leave_the_rest_alone(source: str) -> None:
    assert check_source(source) == []


def test_the_tree_check_reports_what_breaks_a_rule_outside_its_home(tmp_path: Path) -> None:
    (tmp_path / "runtime").mkdir()
    (tmp_path / "frontend").mkdir()
    (tmp_path / "runtime/contract.py").write_text("def k(ns): return f'{ns}:live'\n")
    (tmp_path / "runtime/redis_conn.py").write_text("def c(u): return Redis.from_url(u)\n")
    (tmp_path / "frontend/relay.py").write_text(
        "def run(url, ns):\n    c = Redis.from_url(url)\n    return c.get(f'{ns}:live:relay')\n"
    )
    found = check_tree(tmp_path, SCANNED, exempt=OWN_JOB)
    assert [str(f) for f in found] == [
        "frontend/relay.py:2: redis-client: Redis.from_url(...)",
        "frontend/relay.py:3: redis-key: f'{ns}:live:relay'",
    ]
