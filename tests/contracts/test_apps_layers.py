"""Contracts as tests: the control plane's layers (import-linter, ``apps_contracts.ini``) and
every test file's level marker. Each checker is also run on a tmp tree that breaks it, so a
contract that stopped catching anything fails here too."""

from __future__ import annotations

import ast
import configparser
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
CONTRACTS = Path(__file__).with_name("apps_contracts.ini")
LEVELS = frozenset({"unit", "db", "integration", "e2e", "browser", "gpu"})
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(config: Path, *, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run import-linter on ``config`` with ``cwd`` first on the import path (static: nothing
    is imported)."""
    env = {**os.environ, "PYTHONPATH": str(cwd), "COLUMNS": "200", "NO_COLOR": "1"}  # no wrapping
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(config)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def level_marker_errors(paths: list[Path]) -> list[str]:
    """The test files among ``paths`` without a module-level ``pytestmark`` naming a level."""
    errors = []
    for path in paths:
        levels: set[str] = set()
        for node in ast.parse(path.read_text(), filename=str(path)).body:
            targets = node.targets if isinstance(node, ast.Assign) else []
            if isinstance(node, ast.AnnAssign):
                targets = [node.target]
            if not any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in targets):
                continue
            for sub in ast.walk(node):
                if (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.value, ast.Attribute)
                    and sub.value.attr == "mark"
                ):
                    levels.add(sub.attr)
        if not levels & LEVELS:
            errors.append(f"{path}: no pytestmark with one of {sorted(LEVELS)}")
    return errors


def _test_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if p.name.startswith("test_"))


# --- the layers -------------------------------------------------------------------------------


def test_the_apps_keep_their_layers() -> None:
    result = lint_imports(CONTRACTS, cwd=ROOT)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def _fake_tree(tmp_path: Path, imports: dict[str, str]) -> Path:
    """A copy of the contracts over a package tree shaped like ours, with ``imports``
    (module -> the module it imports) and nothing else."""
    config = configparser.ConfigParser()
    config.read(CONTRACTS)
    names = (
        "common",
        "tenants",
        "models",
        "billing",
        "scaling",
        "safety",
        "rollouts",
        "batches",
        "core",
    )
    for package in ("apps", "frontend"):
        (tmp_path / package).mkdir()
        (tmp_path / package / "__init__.py").write_text("")
    for name in names:
        (tmp_path / "apps" / name).mkdir()
        (tmp_path / "apps" / name / "__init__.py").write_text("")
    for module, target in imports.items():
        path = tmp_path / Path(*module.split(".")).with_suffix(".py")
        path.write_text(f"def later() -> None:\n    import {target}  # deferred counts too\n")
    copy = tmp_path / "contracts.ini"
    with copy.open("w") as handle:
        config.write(handle)
    return copy


@pytest.mark.parametrize(
    ("imports", "broken"),
    [
        ({"apps.common.audit": "apps.tenants"}, "apps: common < tenants"),
        ({"apps.tenants.api": "apps.billing"}, "apps: common < tenants"),
        ({"apps.billing.ledger": "apps.scaling"}, "billing, scaling and safety are independent"),
        ({"apps.safety.consume": "apps.billing"}, "billing, scaling and safety are independent"),
        ({"apps.rollouts.views": "frontend"}, "never import the dashboard"),
    ],
)
def test_the_contracts_catch_a_breach(tmp_path: Path, imports: dict[str, str], broken: str) -> None:
    config = _fake_tree(tmp_path, imports)

    result = lint_imports(config, cwd=tmp_path)

    assert result.returncode != 0, result.stdout
    assert any(broken in line and "BROKEN" in line for line in result.stdout.splitlines())


def test_a_clean_fake_tree_passes(tmp_path: Path) -> None:
    clean = {"apps.core.seed": "apps.tenants", "apps.tenants.x": "apps.common"}
    config = _fake_tree(tmp_path, clean)

    result = lint_imports(config, cwd=tmp_path)

    assert result.returncode == 0, result.stdout + result.stderr


# --- the level markers ------------------------------------------------------------------------


def test_every_test_file_carries_its_level_marker() -> None:
    assert level_marker_errors(_test_files(ROOT / "tests")) == []


def test_the_marker_check_catches_a_missing_or_wrong_level(tmp_path: Path) -> None:
    (tmp_path / "test_none.py").write_text("def test_x():\n    pass\n")
    (tmp_path / "test_other.py").write_text("import pytest\npytestmark = pytest.mark.timing\n")
    (tmp_path / "test_inner.py").write_text(
        "import pytest\n\ndef test_x():\n    pytestmark = pytest.mark.unit\n"
    )
    (tmp_path / "test_list.py").write_text(
        "import pytest\npytestmark = [pytest.mark.db, pytest.mark.django_db]\n"
    )
    (tmp_path / "test_one.py").write_text("import pytest\npytestmark = pytest.mark.gpu\n")

    errors = level_marker_errors(_test_files(tmp_path))

    assert [Path(e.split(":")[0]).name for e in errors] == [
        "test_inner.py",
        "test_none.py",
        "test_other.py",
    ]
