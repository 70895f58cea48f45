"""langchain-openai's ChatOpenAI pointed at the router answers as it does pointed at the
engine: the same message fields, response metadata keys and usage (invoke and stream)."""

from __future__ import annotations

from typing import Any

import pytest
from compat_ways import MODEL, Ways
from langchain_openai import ChatOpenAI

pytestmark = pytest.mark.e2e

PROMPT = [("system", "You are terse."), ("user", "Name a colour.")]


def model(base_url: str, key: str, **kwargs: Any) -> ChatOpenAI:
    return ChatOpenAI(
        model=MODEL,
        base_url=base_url,
        api_key=key,  # type: ignore[arg-type]
        max_tokens=6,  # type: ignore[call-arg]
        temperature=0.0,
        max_retries=0,
        timeout=120,
        **kwargs,
    )


def test_invoke(ways: Ways) -> None:
    direct = model(ways.direct_url, "unused").invoke(PROMPT)
    routed = model(ways.routed_url, ways.key).invoke(PROMPT)
    assert type(routed) is type(direct)
    assert isinstance(routed.content, str)
    assert set(routed.response_metadata) == set(direct.response_metadata)
    assert routed.response_metadata["model_name"] == direct.response_metadata["model_name"]
    assert routed.response_metadata["finish_reason"] in ("length", "stop")
    assert routed.usage_metadata is not None
    assert direct.usage_metadata is not None
    assert set(routed.usage_metadata) == set(direct.usage_metadata)
    assert routed.usage_metadata["input_tokens"] == direct.usage_metadata["input_tokens"]


def test_stream(ways: Ways) -> None:
    def chunks(base_url: str, key: str) -> list[Any]:
        return list(model(base_url, key, stream_usage=True).stream(PROMPT))

    direct, routed = chunks(ways.direct_url, "unused"), chunks(ways.routed_url, ways.key)
    assert routed
    assert "".join(str(c.content) for c in routed)
    with_usage = [c for c in routed if c.usage_metadata]
    assert len(with_usage) == len([c for c in direct if c.usage_metadata]) == 1
    assert (
        with_usage[0].usage_metadata["input_tokens"]
        == next(c for c in direct if c.usage_metadata).usage_metadata["input_tokens"]
    )
    finish = [c.response_metadata.get("finish_reason") for c in routed]
    assert finish.count(None) == len(finish) - 1 or any(f in ("length", "stop") for f in finish)
    assert {k for c in routed for k in c.response_metadata} == {
        k for c in direct for k in c.response_metadata
    }
