"""The router is transparent: the unmodified openai client gets the same answer through it as
from the real vLLM engine directly, for the requests agent frameworks, structured-output
clients and evaluation harnesses send.

Each case sends one request both ways and compares the outcomes: on success the status and the
answer's shape (every key present, recursively; value types; the number of choices; for a
stream, the set of chunk shapes), on refusal the exception class (so the HTTP status) and an
OpenAI error document. The demo model's weights are random, so the words are not compared.
Where vLLM itself refuses a request (see ``ENGINE_REFUSES``), the router must refuse it the
same way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import openai
import pytest
from compat_ways import MODEL

pytestmark = pytest.mark.e2e

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
TOOL_TURNS = [
    {"role": "system", "content": "You are a weather bot."},
    *USER,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature_c": 21}'},
    {"role": "user", "content": "And tomorrow?"},
]

Outcome = tuple[str, Any, str]  # ("ok" | "refused", what is compared, the error message)


def shape(value: Any) -> Any:
    """Keys and value types, recursively; a list as the set of its items' shapes."""
    if isinstance(value, dict):
        return {key: shape(item) for key, item in sorted(value.items())}
    if isinstance(value, list):
        return sorted({repr(shape(item)) for item in value})
    return type(value).__name__


def outcome(call: Callable[[], Any]) -> Outcome:
    """("ok", what the client parsed, as the JSON it came from) or ("refused", details)."""
    try:
        result = call()
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        error = body.get("error", body) if isinstance(body, dict) else {}
        return (
            "refused",
            {
                "class": type(exc).__name__,
                "status": exc.status_code,
                "has_message": bool(isinstance(error, dict) and error.get("message")),
            },
            str(error.get("message") if isinstance(error, dict) else body),
        )
    if isinstance(result, openai.Stream):
        chunks = [chunk.model_dump(exclude_unset=True) for chunk in result]
        return "ok", {"stream": True, "chunks": chunk_shapes(chunks)}, ""
    document = result.model_dump(exclude_unset=True)
    return "ok", {"choices": len(document.get("choices", [])), "shape": shape(document)}, ""


def chunk_shapes(chunks: list[dict[str, Any]]) -> dict[str, Any]:
    choices = {c["index"] for chunk in chunks for c in chunk.get("choices", [])}
    return {
        "shapes": sorted({repr(shape(chunk)) for chunk in chunks}),
        "choice_indexes": sorted(choices),
        "usage_chunks": sum(1 for chunk in chunks if chunk.get("usage")),
        "finished": sorted(
            {
                c.get("finish_reason") is not None
                for chunk in chunks
                for c in chunk.get("choices", [])
            }
        ),
    }


def same_both_ways(
    direct: openai.OpenAI, routed: openai.OpenAI, call: Callable[[openai.OpenAI], Any]
) -> Outcome:
    """Send the request both ways; assert the outcomes match; return the direct one."""
    expected = outcome(lambda: call(direct))
    got = outcome(lambda: call(routed))
    if got[:2] != expected[:2] and got[0] == expected[0] == "ok" and "chunks" in got[1]:
        direct_only = set(expected[1]["chunks"]["shapes"]) - set(got[1]["chunks"]["shapes"])
        routed_only = set(got[1]["chunks"]["shapes"]) - set(expected[1]["chunks"]["shapes"])
        pytest.fail(
            f"stream chunk shapes differ: direct only {direct_only}; routed only {routed_only}"
        )
    assert got[:2] == expected[:2], (got, expected)
    return expected


def chat(**kwargs: Any) -> Callable[[openai.OpenAI], Any]:
    params = {"model": MODEL, "messages": USER, "max_tokens": 6, "temperature": 0.0, **kwargs}
    return lambda client: client.chat.completions.create(**params)


# Requests the demo engine itself refuses (its launch has no --enable-auto-tool-choice and no
# tool parser, so tool_choice "auto" is a 400 from vLLM): the router must refuse them the same.
# The demo engine is launched without --enable-auto-tool-choice and --tool-call-parser, so
# vLLM refuses tool_choice "auto" (also implicit when tools are given) and a named tool_choice
# ("requires --tool-call-parser to be set") with a 400; the router must refuse them the same.
# tool_choice "none" and the tool-call history without tools are served.
ENGINE_REFUSES = {"tool_choice_auto", "tool_choice_named", "tools_in_a_conversation"}

CASES: dict[str, Callable[[openai.OpenAI], Any]] = {
    "plain": chat(),
    "tool_choice_auto": chat(tools=[WEATHER_TOOL], tool_choice="auto"),
    "tool_choice_named": chat(
        tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        max_tokens=24,
    ),
    "tool_choice_none": chat(tools=[WEATHER_TOOL], tool_choice="none"),
    "response_format_json_object": chat(response_format={"type": "json_object"}, max_tokens=8),
    "logprobs": chat(logprobs=True, top_logprobs=2),
    "n_2": chat(n=2, temperature=0.8, seed=11),
    "seed": chat(seed=7, temperature=0.9, top_p=0.9),
    "stop": chat(stop=["\n", "."], max_tokens=8),
    "vllm_extensions": chat(extra_body={"top_k": 5, "ignore_eos": True, "min_p": 0.05}),
    "tool_call_history": chat(messages=TOOL_TURNS),
    "tools_in_a_conversation": chat(messages=TOOL_TURNS, tools=[WEATHER_TOOL]),
    "max_completion_tokens_user_metadata": chat(
        max_tokens=None, max_completion_tokens=5, user="u-1", logit_bias={"5": -100}
    ),
    "stream_n_2_usage": chat(
        n=2, stream=True, stream_options={"include_usage": True}, temperature=0.5, seed=3
    ),
    "stream_logprobs_no_usage": chat(stream=True, logprobs=True, top_logprobs=1),
    "engine_refuses_top_logprobs": chat(logprobs=True, top_logprobs=10_000),
    "completion_token_prompt_echo": lambda client: client.completions.create(
        model=MODEL, prompt=[1, 2, 3, 4], max_tokens=4, temperature=0.0, logprobs=2, echo=True
    ),
    "completion_stream": lambda client: client.completions.create(
        model=MODEL, prompt="The switchyard", max_tokens=4, stream=True, temperature=0.0
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_answer_through_the_router(
    direct: openai.OpenAI, routed: openai.OpenAI, case: str
) -> None:
    result = same_both_ways(direct, routed, CASES[case])
    if case in ENGINE_REFUSES or case.startswith("engine_refuses"):
        print(f"{case}: the engine refuses it directly: {result[2]}")
        assert result[0] == "refused", f"the engine now serves {case}: move it out"
        assert result[1]["status"] == 400
    else:
        assert result[0] == "ok", result
    if case == "n_2":
        assert result[1]["choices"] == 2
    if case == "stream_n_2_usage":
        assert result[1]["chunks"]["choice_indexes"] == [0, 1]
        assert result[1]["chunks"]["usage_chunks"] == 1
    if case == "stream_logprobs_no_usage":
        assert result[1]["chunks"]["usage_chunks"] == 0  # the router asked; the client did not


@pytest.mark.parametrize("bad", [{"temperature": -1.0}, {"n": 0}, {"max_tokens": 0}])
def test_the_routers_own_value_errors_are_400_like_the_engines(
    direct: openai.OpenAI, routed: openai.OpenAI, bad: dict[str, Any]
) -> None:
    """A bad value the router reads itself: the router answers 400 where vLLM answers 400
    (never 422), so the client raises BadRequestError either way."""
    expected = outcome(lambda: chat(**bad)(direct))
    got = outcome(lambda: chat(**bad)(routed))
    assert expected[0] == got[0] == "refused", (expected, got)
    assert got[2]
    assert expected[2]
    assert got[1] == {"class": "BadRequestError", "status": 400, "has_message": True}
    assert expected[1]["class"] == "BadRequestError", expected
