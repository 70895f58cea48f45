"""RouterMetrics: its own registry, stage histograms, bounded tenant labels."""

from __future__ import annotations

import pytest
from prometheus_client import REGISTRY

from runtime.telemetry.metrics import (
    OTHER,
    STAGES,
    BoundedLabel,
    PoolView,
    RouterMetrics,
    StageLabels,
)

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


def test_the_headroom_gate_shows_who_is_held_back_and_the_limits() -> None:
    metrics = RouterMetrics(max_tenant_labels=2)
    held_back = PoolView(
        pool="cpu",
        over=frozenset({"acme", "flood", "zeta"}),
        over_limit=20,
        flooding=frozenset({"flood"}),
        flood_limit=3,
    )
    views = [held_back, PoolView(pool="gpu")]  # gpu: nobody held back, no series
    metrics.tenant_label("acme")
    metrics.tenant_label("flood")  # zeta folds into "other"
    metrics.attach_scheduling(lambda: views)
    text = metrics.render()[0].decode()
    held = sorted(line for line in text.splitlines()
                  if line.startswith("switchyard_tenant_held_back{"))  # fmt: skip
    assert held == [
        'switchyard_tenant_held_back{pool="cpu",rule="flooding",tenant="flood"} 1.0',
        'switchyard_tenant_held_back{pool="cpu",rule="over_share",tenant="acme"} 1.0',
        f'switchyard_tenant_held_back{{pool="cpu",rule="over_share",tenant="{OTHER}"}} 1.0',
    ]
    assert 'switchyard_headroom_limit_slots{group="over_share",pool="cpu"} 20.0' in text
    assert 'switchyard_headroom_limit_slots{group="flooding",pool="cpu"} 3.0' in text
    names = ("switchyard_tenant_held_back", "switchyard_headroom_limit")
    gated = [line for line in text.splitlines() if line.startswith(names)]
    assert not [line for line in gated if 'pool="gpu"' in line]
