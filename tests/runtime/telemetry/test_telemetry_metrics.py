"""RouterMetrics: its own registry, stage histograms, bounded tenant labels."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from runtime.telemetry.metrics import OTHER, STAGES, BoundedLabel, RouterMetrics, StageLabels

pytestmark = pytest.mark.unit


def test_bounded_label_keeps_the_first_n_values() -> None:
    label = BoundedLabel(2)
    assert label("") == ""  # not known yet (an unauthenticated request): costs no slot
    assert [label(v) for v in ("a", "b", "c", "a", "d", "b")] == ["a", "b", OTHER, "a", OTHER, "b"]
    with pytest.raises(ValueError, match="limit"):
        BoundedLabel(-1)


def test_stage_histograms_and_outcome_counters_render() -> None:
    metrics = RouterMetrics(max_tenant_labels=1)
    labels = StageLabels(model="m", version="v1", endpoint="3", klass="interactive")
    for stage in STAGES:
        metrics.observe(stage, 0.002, labels)
    observer = metrics.stage_observer("inter_token", labels)
    observer.observe(0.01)
    metrics.observe("auth", -1.0, labels)  # clocks never make a negative duration
    metrics.count(model="m", klass="interactive", outcome="ok", tenant="acme")
    metrics.count(model="m", klass="interactive", outcome="ok", tenant="globex")
    body, content_type = metrics.render()
    text = body.decode()
    assert content_type.startswith("text/plain")
    for stage in STAGES:
        assert f'stage="{stage}"' in text
    assert (
        'switchyard_stage_seconds_count{class="interactive",endpoint="3",model="m",'
        'stage="inter_token",version="v1"} 2.0'
    ) in text
    assert 'le="0.001"' in text  # millisecond resolution
    assert 'tenant="acme"' in text
    assert 'tenant="other"' in text
    assert "globex" not in text


def test_each_instance_has_its_own_registry() -> None:
    first, second = RouterMetrics(), RouterMetrics()  # would clash in a shared registry
    first.count(model="m", klass="", outcome="ok", tenant="t")
    assert b"switchyard_requests_total" in first.render()[0]
    assert b'tenant="t"' not in second.render()[0]
    assert REGISTRY.get_sample_value("switchyard_requests_total") is None
