"""Model aliases: the smallest sufficient model per request (runtime.gateway.aliases)."""

from __future__ import annotations

import random
from typing import Any

import pytest

from runtime.gateway.aliases import required_capabilities, resolve_alias
from runtime.gateway.errors import ApiError
from runtime.gateway.tokens import TokenCounter
from runtime.routing.table import RoutingTable
from runtime.testing.snapshots import SnapshotBuilder

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]

TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {}}}]
IMAGE = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]


def world() -> SnapshotBuilder:
    built = SnapshotBuilder().add_tenant("acme").add_tenant("narrow", models=("big",))
    built.add_model("small", 1, max_context=256)
    built.add_model("mid", 2, max_context=2048, capabilities=("json_output",))
    built.add_model("big", 3, max_context=8192, capabilities=("json_output", "tools", "vision"))
    for endpoint, version in ((1, 1), (2, 2), (3, 3)):
        built.add_endpoint(endpoint, version)
    built.add_price(1, input_per_1k=0.1, output_per_1k=0.2)
    built.add_price(2, input_per_1k=1.0, output_per_1k=2.0)
    built.add_price(3, input_per_1k=5.0, output_per_1k=10.0)
    return built.add_alias("fam", ("big", "mid", "small"))


async def resolve(
    document: dict[str, Any], *, max_tokens: int | None = 16, tenant: str = "acme",
    built: SnapshotBuilder | None = None,
) -> str:  # fmt: skip
    snapshot = (built or world()).snapshot()
    messages = document.get("messages", [{"role": "user", "content": "hi"}])
    texts = [m["content"] if isinstance(m["content"], str) else "" for m in messages]
    model, version = await resolve_alias(
        snapshot, snapshot.aliases["fam"], tenant=snapshot.tenants[tenant], document=document,
        texts=texts, overheads=[0] * len(texts), max_tokens=max_tokens, tokens=TokenCounter(),
        table=RoutingTable(), rng=random.Random(1), user=None, headers=(),
    )  # fmt: skip
    assert version.model == model.name
    return model.name


async def test_required_capabilities_read_the_body():
    assert required_capabilities({"messages": []}) == frozenset()
    assert required_capabilities({"tools": TOOLS}) == {"tools"}
    assert required_capabilities({"functions": [{"name": "f"}]}) == {"tools"}
    assert required_capabilities({"response_format": {"type": "json_object"}}) == {"json_output"}
    assert required_capabilities({"response_format": {"type": "json_schema"}}) == {"json_output"}
    assert required_capabilities({"response_format": {"type": "text"}}) == frozenset()
    assert required_capabilities({"messages": IMAGE}) == {"vision"}


async def test_the_cheapest_fitting_member_serves():
    assert await resolve({}) == "small"


async def test_capabilities_move_the_request_up():
    assert await resolve({"response_format": {"type": "json_object"}}) == "mid"
    assert await resolve({"tools": TOOLS}) == "big"
    assert await resolve({"messages": IMAGE}) == "big"


async def test_the_context_moves_the_request_up():
    assert await resolve({}, max_tokens=300) == "mid"
    long = [{"role": "user", "content": "x" * 3000}]
    assert await resolve({"messages": long}, max_tokens=100) == "big"


async def test_a_tie_goes_to_the_member_listed_first():
    built = world()
    built.prices.clear()  # nothing priced: every member costs nothing
    assert await resolve({}, built=built) == "big"


async def test_a_member_the_tenant_may_not_use_is_skipped():
    assert await resolve({}, tenant="narrow") == "big"


async def test_nothing_fits_is_a_400_saying_why():
    with pytest.raises(ApiError) as caught:
        await resolve({"messages": IMAGE}, tenant="narrow", max_tokens=9000)
    error = caught.value
    assert error.status == 400
    assert error.code == "model_alias_unfit"
    assert error.param == "model"
    assert "alias 'fam'" in error.message
    assert "big holds 4096 tokens, the request needs" in error.message
    assert "mid is not available to you" in error.message
