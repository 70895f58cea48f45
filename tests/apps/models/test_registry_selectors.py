"""Registry reads."""

from __future__ import annotations

import pytest

from apps.models.selectors import (
    endpoints_live,
    model_get_by_name,
    model_versions_published,
    pools_with_endpoints,
    route_for,
)
from apps.models.services import endpoint_register, endpoint_set_state, pool_create, route_set

pytestmark = [pytest.mark.db, pytest.mark.django_db]


def test_published_versions(llm, make_version):
    v1 = make_version("v1", publish=True)
    make_version("draft")
    v2 = make_version("v2", publish=True)

    assert list(model_versions_published()) == [v1, v2]
    assert list(model_versions_published(llm)) == [v1, v2]
    assert model_get_by_name("tiny-llama") == llm
    assert model_get_by_name("nope") is None


@pytest.mark.parametrize(
    "url",
    [
        "http://vllm-0:8000",
        "https://10.0.0.5:8443/v1",
        "http://[::1]:8000",
        "http://w.svc.cluster.local",
    ],
)
def test_endpoint_urls_accepted(pool, published, url):
    endpoint = endpoint_register(actor=None, pool=pool, version=published, base_url=url, capacity=1)
    assert endpoint.base_url == url


def test_live_endpoints_and_pools(pool, published):
    gone = endpoint_register(
        actor=None, pool=pool, version=published, base_url="http://a:1", capacity=1
    )
    ready = endpoint_register(
        actor=None, pool=pool, version=published, base_url="http://b:1", capacity=1
    )
    endpoint_set_state(actor=None, endpoint=gone, state="gone")
    endpoint_set_state(actor=None, endpoint=ready, state="ready")
    empty = pool_create(actor=None, name="empty", hardware_tier="h100", cost_per_replica_hour=1)

    assert list(endpoints_live()) == [ready]
    pools = {p.name: p for p in pools_with_endpoints()}
    assert pools[pool.name].live_endpoints == [ready]
    assert pools[empty.name].live_endpoints == []


def test_route_for(llm, published):
    assert route_for(llm) is None
    route_set(actor=None, model=llm, splits=[(published, 1)])
    route = route_for(llm)
    assert [(s.version, s.weight) for s in route.splits.all()] == [(published, 1)]
