"""The tiny Prometheus text reader."""

from __future__ import annotations

import pytest

from runtime.upstream import parse_samples

pytestmark = pytest.mark.unit

NAMES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc")


def test_sums_label_sets_and_skips_help_type_and_lookalikes() -> None:
    text = (
        "# HELP vllm:num_requests_running Number of requests.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:num_requests_running{model_name="m",engine="0"} 3.0\n'
        'vllm:num_requests_running{model_name="m",engine="1"} 2\n'
        "vllm:num_requests_running_total 99\n"
        "vllm:num_requests_waiting 1.0 1700000000000\n"
    )
    found = parse_samples(text, NAMES)
    assert found == {"vllm:num_requests_running": [3.0, 2.0], "vllm:num_requests_waiting": [1.0]}


def test_label_values_with_braces_quotes_and_spaces() -> None:
    text = 'vllm:kv_cache_usage_perc{model_name="a} \\"b\\" {c",engine="0"} 0.25\r\n'
    assert parse_samples(text, NAMES) == {"vllm:kv_cache_usage_perc": [0.25]}


@pytest.mark.parametrize(
    "line",
    [
        'vllm:num_requests_waiting{model_name="m" 1',  # unterminated labels
        "vllm:num_requests_waiting{} bogus",
        "vllm:num_requests_waiting",
        "vllm:num_requests_waiting NaN",
        "  vllm:num_requests_waiting 5",  # indented: not a sample line
    ],
)
def test_unparsable_samples_are_skipped(line: str) -> None:
    assert parse_samples(line + "\n", NAMES) == {}


def test_special_float_values() -> None:
    assert parse_samples("vllm:num_requests_waiting +Inf", NAMES) == {
        "vllm:num_requests_waiting": [float("inf")]
    }
