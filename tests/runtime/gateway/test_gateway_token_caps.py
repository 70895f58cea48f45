"""Token counting (byte bound first, the version's tokenizer when it matters) and the caps."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest
from gateway_fleet import World, limits
from tokenizers import Tokenizer, models, pre_tokenizers

from runtime.gateway.caps import context_cap, embedding_budget, generation_budget
from runtime.gateway.errors import ApiError
from runtime.gateway.tokens import (
    MESSAGE_OVERHEAD,
    REQUEST_OVERHEAD,
    TokenCount,
    TokenCounter,
    byte_bound,
    prefill_estimate,
    text_overheads,
    tokenizer_path,
)
from runtime.snapshot import TenantSnap, VersionSnap

pytestmark = pytest.mark.unit


def write_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer: one token per known word, far fewer than bytes."""
    vocab = {"[UNK]": 0, "hello": 1, "world": 2}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "tokenizer.json"
    tokenizer.save(str(path))
    return path


def make_version(
    *, tokenizer: str = "", artifact_uri: str = "", max_context: int = 0
) -> VersionSnap:
    world = World()
    world.add_model("m", 1, max_context=max_context)
    return msgspec.structs.replace(
        world.versions[1], tokenizer=tokenizer, artifact_uri=artifact_uri
    )


def make_tenant(*, max_context: int, max_output: int) -> TenantSnap:
    world = World()
    world.add_tenant("t", tenant_limits=limits(max_context=max_context, max_output=max_output))
    return world.tenants["t"]


def test_byte_bound_counts_bytes_and_overheads() -> None:
    texts = ["héllo", "abc"]
    overheads = text_overheads(texts, ["user", "assistant"])
    assert overheads == [MESSAGE_OVERHEAD + 4, MESSAGE_OVERHEAD + 9]
    assert byte_bound(texts, overheads) == REQUEST_OVERHEAD + 6 + 3 + sum(overheads)
    assert text_overheads(texts, None) == [0, 0]


def test_tokenizer_is_found_by_file_directory_or_artifact_uri(tmp_path: Path) -> None:
    path = write_tokenizer(tmp_path / "art")
    assert tokenizer_path(make_version(tokenizer=str(path))) == path
    assert tokenizer_path(make_version(tokenizer=str(path.parent))) == path
    assert tokenizer_path(make_version(artifact_uri=path.parent.as_uri())) == path
    assert tokenizer_path(make_version(tokenizer="org/remote-model")) is None
    assert tokenizer_path(make_version(artifact_uri="s3://bucket/model")) is None


@pytest.mark.asyncio
async def test_exact_count_only_when_the_bound_is_over_budget(tmp_path: Path) -> None:
    version = make_version(tokenizer=str(write_tokenizer(tmp_path)))
    counter = TokenCounter()
    texts = ["hello world " * 10]
    cheap = await counter.count(version, texts, [0], budget=10_000)
    assert not cheap.exact
    assert cheap.tokens == REQUEST_OVERHEAD + 120
    exact = await counter.count(version, texts, [0], budget=50)
    assert exact.exact
    assert exact.tokens == REQUEST_OVERHEAD + 20


@pytest.mark.asyncio
async def test_without_a_tokenizer_the_bound_stands(tmp_path: Path) -> None:
    counter = TokenCounter()
    version = make_version(tokenizer=str(tmp_path / "missing"))
    count = await counter.count(version, ["hello"], [0], budget=1)
    assert not count.exact
    assert await counter.tokenizer(version) is None


@pytest.mark.asyncio
async def test_the_tokenizer_cache_is_bounded(tmp_path: Path) -> None:
    path = write_tokenizer(tmp_path)
    counter = TokenCounter(cache_size=1)
    first = msgspec.structs.replace(make_version(tokenizer=str(path)), id=1)
    second = msgspec.structs.replace(first, id=2)
    assert await counter.tokenizer(first) is not None
    assert await counter.tokenizer(second) is not None
    assert list(counter._tokenizers) == [2]  # the bound holds


@pytest.mark.asyncio
async def test_generation_budget_caps() -> None:
    counter = TokenCounter()
    version = make_version(max_context=100)
    tenant = make_tenant(max_context=1000, max_output=30)
    assert context_cap(tenant, version) == 100
    common = {"tenant": tenant, "version": version, "param": "max_tokens", "prompt_param": "prompt"}
    prompt, max_tokens = await generation_budget(
        counter, texts=["x" * 10], overheads=[0], requested_max_tokens=None, **common
    )
    assert (prompt.tokens, max_tokens) == (REQUEST_OVERHEAD + 10, 30)  # the tenant's default
    _, shrunk = await generation_budget(
        counter, texts=["x" * 80], overheads=[0], requested_max_tokens=None, **common
    )
    assert shrunk == 100 - REQUEST_OVERHEAD - 80  # the default shrinks to fit the context
    with pytest.raises(ApiError) as over_output:
        await generation_budget(
            counter, texts=["x"], overheads=[0], requested_max_tokens=31, **common
        )
    assert (over_output.value.code, over_output.value.param) == (
        "max_tokens_exceeded",
        "max_tokens",
    )
    with pytest.raises(ApiError) as over_context:
        await generation_budget(
            counter, texts=["x" * 80], overheads=[0], requested_max_tokens=30, **common
        )
    assert (over_context.value.code, over_context.value.param) == (
        "context_length_exceeded",
        "prompt",
    )
    assert "no tokenizer is available" in over_context.value.message
    with pytest.raises(ApiError) as full:
        await generation_budget(
            counter, texts=["x" * 200], overheads=[0], requested_max_tokens=None, **common
        )
    assert full.value.code == "context_length_exceeded"


@pytest.mark.asyncio
async def test_n_sequences_share_the_output_cap() -> None:
    counter = TokenCounter()
    version = make_version(max_context=100)
    tenant = make_tenant(max_context=1000, max_output=30)
    common = {"tenant": tenant, "version": version, "param": "max_tokens", "prompt_param": "prompt"}
    _, each = await generation_budget(
        counter, texts=["x"], overheads=[0], requested_max_tokens=15, sequences=2, **common
    )
    assert each == 15  # 2 x 15 fits the cap of 30
    with pytest.raises(ApiError) as over:
        await generation_budget(
            counter, texts=["x"], overheads=[0], requested_max_tokens=16, sequences=2, **common
        )
    assert (over.value.code, over.value.param) == ("max_tokens_exceeded", "max_tokens")
    assert "32 (2 x 16)" in over.value.message
    _, default = await generation_budget(
        counter, texts=["x"], overheads=[0], requested_max_tokens=None, sequences=3, **common
    )
    assert default == 10  # the default output budget split over three choices
    with pytest.raises(ApiError) as too_many:
        await generation_budget(
            counter, texts=["x"], overheads=[0], requested_max_tokens=None, sequences=31, **common
        )
    assert (too_many.value.code, too_many.value.param) == ("max_tokens_exceeded", "n")


@pytest.mark.asyncio
async def test_an_exact_count_admits_what_the_bound_would_refuse(tmp_path: Path) -> None:
    counter = TokenCounter()
    version = make_version(tokenizer=str(write_tokenizer(tmp_path)), max_context=64)
    tenant = make_tenant(max_context=64, max_output=16)
    texts = ["hello world " * 8]  # 96 bytes, 16 tokens
    prompt, max_tokens = await generation_budget(
        counter, tenant=tenant, version=version, texts=texts, overheads=[0],
        requested_max_tokens=16, param="max_tokens", prompt_param="messages",
    )  # fmt: skip
    assert prompt.exact
    assert prompt.tokens == REQUEST_OVERHEAD + 16
    assert max_tokens == 16
    with pytest.raises(ApiError) as info:
        await generation_budget(
            counter, tenant=tenant, version=version, texts=texts * 3, overheads=[0, 0, 0],
            requested_max_tokens=16, param="max_tokens", prompt_param="messages",
        )  # fmt: skip
    assert "is 56 tokens" in info.value.message


@pytest.mark.asyncio
async def test_embedding_budget() -> None:
    counter = TokenCounter()
    version = make_version()
    tenant = make_tenant(max_context=20, max_output=1)
    assert await embedding_budget(counter, tenant=tenant, version=version, texts=["ab", "c"]) == (
        2 * REQUEST_OVERHEAD + 3
    )
    with pytest.raises(ApiError) as info:
        await embedding_budget(counter, tenant=tenant, version=version, texts=["y" * 30])
    assert (info.value.code, info.value.param) == ("context_length_exceeded", "input")
    tokens = await embedding_budget(
        counter, tenant=tenant, version=version, texts=["", ""], overheads=[3, 4]
    )
    assert tokens == 2 * REQUEST_OVERHEAD + 7  # token arrays count one token per id
    with pytest.raises(ApiError) as long_array:
        await embedding_budget(
            counter, tenant=tenant, version=version, texts=["", ""], overheads=[1, 30]
        )
    assert long_array.value.param == "input[1]"


def test_the_prefill_estimate_is_the_count_when_exact_else_characters_over_four() -> None:
    """The byte bound is no estimate (issue #34: the dispatcher's prefill pacing read it and
    lent nothing); without a tokenizer the estimate is 4 characters a token."""
    texts = ["x" * 400, "héllo"]
    overheads = text_overheads(texts, ["user", "user"])
    bound = TokenCount(byte_bound(texts, overheads), exact=False)
    estimate = prefill_estimate(bound, texts, overheads)
    assert estimate == REQUEST_OVERHEAD + 100 + 2 + sum(overheads)
    assert bound.tokens == REQUEST_OVERHEAD + 400 + 6 + sum(overheads)
    assert prefill_estimate(TokenCount(57, exact=True), texts, overheads) == 57
