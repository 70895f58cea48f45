"""The configuration reference is generated from the code and cannot go stale."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_config_reference", ROOT / "docs" / "gen_config_reference.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_committed_page_matches_the_generator() -> None:
    gen = _generator()
    committed = gen.PAGE.read_text()
    assert committed == gen.render(gen.collect()), (
        "docs/reference/configuration.md is stale: run python docs/gen_config_reference.py"
    )


def test_every_variable_the_code_reads_is_listed_with_its_default() -> None:
    variables = _generator().collect()
    # one of each way the sources read the environment
    assert variables["DATABASE_URL"].defaults == ["`postgres://postgres@127.0.0.1:5432/switchyard`"]
    assert variables["DEBUG"].defaults == ["`false`"]  # _env_bool(..., default=False)
    assert variables["SWITCHYARD_MAX_BODY_BYTES"].defaults == ["`1048576`"]  # _number(env, ...)
    assert variables["SWITCHYARD_SNAPSHOT_PREFIX"].defaults == ["`switchyard:snapshot`"]  # contract
    assert variables["SWITCHYARD_SCALING_ACTUATOR"].defaults == ["unset"]  # a module constant name
    assert variables["SWITCHYARD_LIMITS_PREFIX"].defaults == ["unset"]  # env.get(...) or ""
    readers = variables["REDIS_URL"].readers
    assert any("config/settings.py" in r for r in readers)
    assert any("runtime/gateway/config.py" in r for r in readers)


def test_a_new_variable_makes_the_committed_page_stale(tmp_path: Path) -> None:
    gen = _generator()
    for path, _ in gen._source_files(ROOT):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    settings = tmp_path / "config" / "settings.py"
    settings.write_text(
        settings.read_text() + '\nNEW = os.environ.get("SWITCHYARD_DOCS_TEST_NEW", "7")\n'
    )
    (tmp_path / "config" / "new_module.py").write_text(  # a new module of config/, too
        'ENV_KEY = "SWITCHYARD_DOCS_TEST_MODULE"\n'
        "def read(environ):\n"
        '    return environ.get(ENV_KEY, "")\n'
    )
    text = gen.render(gen.collect(tmp_path))
    assert "| `SWITCHYARD_DOCS_TEST_NEW` | `7` | (undocumented) |" in text
    assert "| `SWITCHYARD_DOCS_TEST_MODULE` | unset | (undocumented) |" in text
    assert text != gen.PAGE.read_text()


def test_the_check_mode_fails_on_a_stale_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gen = _generator()
    stale = tmp_path / "docs" / "reference" / "configuration.md"
    stale.parent.mkdir(parents=True)
    stale.write_text(gen.PAGE.read_text().replace("SWITCHYARD_MAX_BODY_BYTES", "GONE"))
    monkeypatch.setattr(gen, "PAGE", stale)  # collect() still reads the real sources
    monkeypatch.setattr(gen, "ROOT", tmp_path)
    assert gen.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().out


def test_the_pool_policies_of_the_sticky_rule_are_listed_with_their_defaults() -> None:
    from dataclasses import fields  # noqa: PLC0415 - this test only

    from runtime.routing.sticky import STICKY_POLICY_KEYS, StickyRule  # noqa: PLC0415

    page = _generator().PAGE.read_text()
    defaults = {f.name: f.default for f in fields(StickyRule)}
    for key, name in STICKY_POLICY_KEYS.items():
        assert f"| `{key}` | `{defaults[name]}` |" in page
    assert "| `prefix_routing` | `on` |" in page
