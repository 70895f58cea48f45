"""``python -m bench setup-peers``: the peer routers, each in its own virtual environment.

Their dependencies (LiteLLM's especially) clash with ours, so each gets
``bench/.venvs/<name>`` made with ``python -m venv`` and filled by pip from PyPI, nothing
else. Versions are pinned to the ones the published figures were measured with; pass
``--latest`` to take PyPI's newest instead.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from bench.targets.base import VENVS


@dataclass(frozen=True)
class Peer:
    name: str
    requirement: str  # pinned
    unpinned: str
    binary: str
    check: tuple[str, ...]  # arguments that must exit 0 once installed


PEERS = (
    Peer("vllm-router", "vllm-router==0.1.17", "vllm-router", "vllm-router", ("--help",)),
    Peer("litellm", "litellm[proxy]==1.106.2", "litellm[proxy]", "litellm", ("--version",)),
    # Not a peer router: the sampling profiler whose flame graph of the router goes in the
    # report (bench/profile.py); a wheel with its own binary, kept out of our venv too.
    Peer("py-spy", "py-spy==0.4.3", "py-spy", "py-spy", ("--version",)),
)
CHECK_ENV = {"PATH": "/usr/bin:/bin", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def venv_of(peer: Peer, root: Path = VENVS) -> Path:
    return root / peer.name


def _run(argv: list[str], *, timeout_s: float, env: dict[str, str] | None = None) -> str:
    """Run a setup step; '' on success, else the reason."""
    try:
        done = subprocess.run(  # noqa: S603 - fixed argv built here
            argv, capture_output=True, text=True, timeout=timeout_s, env=env, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{argv[0]}: {exc}"
    if done.returncode != 0:
        output = (done.stderr or done.stdout)[-800:]
        return f"{' '.join(argv[:4])} exited {done.returncode}: {output}"
    return ""


def setup_peer(peer: Peer, *, latest: bool = False, root: Path = VENVS) -> str:
    """Create and fill one peer's venv; '' when it works, else why not."""
    venv = venv_of(peer, root)
    python = venv / "bin" / "python"
    if not python.exists():
        error = _run([sys.executable, "-m", "venv", "--clear", str(venv)], timeout_s=300)
        if error:
            return error
    requirement = peer.unpinned if latest else peer.requirement
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    error = _run([*pip, requirement], timeout_s=1800)
    if error:
        return error
    return _run([str(venv / "bin" / peer.binary), *peer.check], timeout_s=120,
                env={**CHECK_ENV, "HOME": str(venv)})  # fmt: skip


def setup_peers(names: list[str] | None = None, *, latest: bool = False) -> dict[str, str]:
    """Set up the named peers (all by default); name -> '' (ok) or the reason it failed."""
    chosen = [p for p in PEERS if names is None or p.name in names]
    results = {}
    for peer in chosen:
        print(f"setting up {peer.name} in {venv_of(peer)} ...", flush=True)
        results[peer.name] = setup_peer(peer, latest=latest)
        print(f"  {peer.name}: {results[peer.name] or 'ok'}", flush=True)
    return results
