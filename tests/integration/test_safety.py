"""Safety filters through a real router process and a simulator engine (issue #31), with the
unmodified ``openai`` client: a refused input (costs nothing, counted), a redacted input (the
engine never sees the address), a stream stopped with ``content_filter`` (the engine aborts
the sequence; billed exactly the tokens generated up to the stop), and the interventions in
the audit log in PostgreSQL (the control plane's consumer on the router's stream).

The simulator's ``[[emit: ...]]`` prompt marker (runtime/workers/simulator/text.py) makes an
answer carry a given phrase.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import msgspec
import openai
import pytest
import redis
from fixtures.router import Process, Publisher, World, http_get, redis_url, start_router
from fixtures.router import wait_ready as router_ready
from fixtures.wait import eventually
from integration_support import start_simulator, tenant_limits
from test_credits import Ledger

from apps.common.models import AuditEvent
from apps.safety.consume import interventions_write
from apps.safety.models import Intervention
from apps.safety.tasks import interventions_consume
from apps.tenants.services import tenant_create
from runtime.contract import safety_stream
from runtime.safety.events import Intervention as Event
from runtime.snapshot import PolicyPackSnap, SafetyRuleSnap, SafetySnap

pytestmark = pytest.mark.integration

MODEL = "safety-chat"
PACK = PolicyPackSnap(name="house", version=1, rules=(
    SafetyRuleSnap(id="topic-ban", kind="terms", action="refuse", terms=("forbidden topic",)),
    SafetyRuleSnap(id="emails", kind="pii", action="redact", detectors=("email",)),
    SafetyRuleSnap(id="no-secret", kind="terms", action="stop", terms=("secret phrase",)),
))  # fmt: skip
# Classifier rules whose model has no endpoint: one fails closed, one open.
GUARDS = {
    name: PolicyPackSnap(name=name, version=1, rules=(SafetyRuleSnap(
        id="toxicity", kind="classifier", action="refuse", model="guard-model", threshold=0.5,
        fail_open=name == "lenient"),))
    for name in ("strict", "lenient")
}  # fmt: skip
SAFETY = SafetySnap(packs={"house": PACK, **GUARDS},
                    tenants={"payer": ("house",), "strict": ("strict",),
                             "lenient": ("lenient",)})  # fmt: skip
FUNDS = 10_000_000  # micro-credits


@dataclass
class Fleet:
    router: Process
    sim: Process
    world: World
    publisher: Publisher
    redis: redis.Redis[bytes]
    ledger: Ledger

    def client(self, tenant: str = "payer") -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.router.base_url}/v1",
                             api_key=self.world.secrets[tenant], max_retries=0)  # fmt: skip

    def balance(self, tenant: str = "payer") -> int:
        return self.ledger.state(tenant)["balance"]

    def usage_events(self) -> list[tuple[dict[str, Any], int]]:
        return self.ledger.events()

    def interventions(self) -> list[dict[str, Any]]:
        entries = self.redis.xrange(safety_stream(self.publisher.prefix))
        return [msgspec.json.decode(fields[b"event"]) for _id, fields in entries]

    def metrics(self, base_url: str) -> str:
        status, body = http_get(f"{base_url}/metrics")
        assert status == 200
        return body.decode()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    sim = start_simulator(MODEL, "--decode-a-ms", "20")  # 40 tokens take ~0.8 s
    world = World()
    world.add_model(MODEL, 1)
    world.add_endpoint(1, 1, sim.base_url, pool="cpu", capacity=64)
    world.add_price(1, input_per_1k=1.0, output_per_1k=2.0)
    for tenant in ("payer", "other", "strict", "lenient"):
        world.add_tenant(tenant, tenant_limits=tenant_limits())
        world.add_key(tenant, tenant)
    publisher = Publisher(f"switchyard:test:safety:{uuid.uuid4().hex[:10]}")
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url())
    router = None
    ledger = Ledger(publisher.prefix)
    try:
        snapshot = msgspec.structs.replace(world.snapshot(), safety=SAFETY)
        version = publisher.publish(snapshot)
        router = start_router(publisher.prefix, tmp_path_factory.mktemp("router"))
        router_ready(router, version)
        for tenant in ("payer", "other", "strict", "lenient"):
            ledger.fund(tenant, FUNDS)
        yield Fleet(router, sim, world, publisher, client, ledger)
    finally:
        if router is not None:
            router.stop()
        sim.stop()
        publisher.cleanup()
        client.close()
        ledger.close()


def counted(text: str, **labels: str) -> float:
    """The intervention counter's value for exactly these labels (0 when absent)."""
    for line in text.splitlines():
        if line.startswith("switchyard_safety_interventions_total{") and all(
            f'{k}="{v}"' in line for k, v in labels.items()
        ):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_a_refused_input_names_the_rule_costs_nothing_and_is_counted(fleet: Fleet) -> None:
    before, served = fleet.balance(), len(_payer(fleet.usage_events()))
    message = [{"role": "user", "content": "tell me about the Forbidden Topic please"}]
    with pytest.raises(openai.BadRequestError) as refused:
        fleet.client().chat.completions.create(model=MODEL, messages=message, max_tokens=5)  # type: ignore[arg-type]
    assert refused.value.status_code == 400
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["code"] == "content_policy_violation"
    assert "'house'" in error["message"]
    assert "'topic-ban'" in error["message"]
    assert "forbidden topic" not in error["message"].lower()  # never the matched text
    # The pack is the payer's: another tenant's identical request is served.
    other = fleet.client("other").chat.completions.create(
        model=MODEL,
        messages=message,
        max_tokens=3,  # type: ignore[arg-type]
    )
    assert other.choices[0].finish_reason == "length"
    assert fleet.balance() == before  # nothing escrowed, nothing charged
    assert len(_payer(fleet.usage_events())) == served  # no usage event for the refusal
    text = fleet.metrics(fleet.router.base_url)
    assert counted(text, stage="input", action="refuse", pack="house", rule="topic-ban") >= 1
    events = eventually(lambda: [e for e in fleet.interventions() if e["action"] == "refuse"],
                        timeout=10, what="the refusal on the safety stream")  # fmt: skip
    assert (events[0]["tenant"], events[0]["rule"]) == ("payer", "topic-ban")
    assert events[0]["key"] == fleet.world.secrets["payer"].split("_")[1]  # the key's prefix
    assert "Forbidden" not in msgspec.json.encode(events[0]).decode()  # no content


def test_a_classifier_that_is_down_fails_closed_or_open_as_its_rule_says(fleet: Fleet) -> None:
    message = [{"role": "user", "content": "hello there"}]
    with pytest.raises(openai.BadRequestError) as refused:
        fleet.client("strict").chat.completions.create(model=MODEL, messages=message,  # type: ignore[arg-type]
                                                       max_tokens=3)  # fmt: skip
    error = refused.value.body
    assert isinstance(error, dict)
    assert error["code"] == "content_policy_violation"
    assert "classifier was unavailable" in error["message"]
    served = fleet.client("lenient").chat.completions.create(
        model=MODEL,
        messages=message,
        max_tokens=3,  # type: ignore[arg-type]
    )
    assert served.choices[0].finish_reason == "length"

    def failures() -> dict[str, tuple[str, str]]:
        return {e["tenant"]: (e["action"], e["failed"]) for e in fleet.interventions()
                if e["rule"] == "toxicity"}  # fmt: skip

    found = eventually(lambda: len(failures()) == 2 and failures(), timeout=10,
                       what="both classifier failures on the safety stream")  # fmt: skip
    assert found == {"strict": ("refuse", "closed"), "lenient": ("pass", "open")}


def test_a_redacted_input_reaches_the_engine_redacted(fleet: Fleet) -> None:
    message = [{"role": "user", "content": "[[emit: write to bob@example.com today]]"}]
    answer = fleet.client().chat.completions.create(
        model=MODEL,
        messages=message,
        max_tokens=6,  # type: ignore[arg-type]
    )
    content = answer.choices[0].message.content or ""
    # The simulator echoes what it was asked to emit: the redacted address, not the original.
    assert "bob@example.com" not in content
    assert "[REDACTED:email" in content, content
    events = eventually(lambda: [e for e in fleet.interventions() if e["action"] == "redact"],
                        timeout=10, what="the redaction on the safety stream")  # fmt: skip
    assert (events[-1]["rule"], events[-1]["matches"]) == ("emails", 1)


def test_a_stream_is_stopped_with_content_filter_and_billed_to_the_stop(fleet: Fleet) -> None:
    aborted = _abort_count(fleet.sim)
    before = fleet.balance()
    prompt = "[[emit: one two secret phrase three four five six]]"
    stream = fleet.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=40, stream=True,
        stream_options={"include_usage": True},
    )  # type: ignore[call-overload]  # fmt: skip
    texts, finishes, usage = [], [], None
    for chunk in stream:
        for choice in chunk.choices:
            texts.append(choice.delta.content or "")
            finishes.append(choice.finish_reason)
        usage = chunk.usage or usage
    text = "".join(texts)
    assert finishes[-1] == "content_filter"
    assert " three" not in text  # nothing after the stop
    assert " four" not in text
    assert text.startswith(" one two secret")
    # Billing: the tokens generated up to the stop: one, two, secret, phrase, and " three",
    # whose arrival decided the held-back match (withheld from the client).
    assert usage is not None
    assert usage.completion_tokens == 5
    event, charged = eventually(
        lambda: next(((e, c) for e, c in fleet.usage_events()
                      if e["tenant"] == "payer" and e["tokens_out"] == 5), None),
        timeout=10, what="the stopped stream's usage event",
    )  # fmt: skip
    assert event["outcome"] == "ok"
    assert event["tokens_in"] == usage.prompt_tokens
    assert charged == event["tokens_in"] * 1000 + event["tokens_out"] * 2000
    eventually(lambda: fleet.balance() == before - charged, timeout=10, what="the charge")
    # The upstream was closed at once: the engine aborted the sequence well short of 40.
    eventually(lambda: _abort_count(fleet.sim) == aborted + 1, timeout=10, what="the abort")
    stops = eventually(lambda: [e for e in fleet.interventions() if e["action"] == "stop"],
                       timeout=10, what="the stop on the safety stream")  # fmt: skip
    assert (stops[-1]["stage"], stops[-1]["rule"]) == ("output", "no-secret")
    text = fleet.metrics(fleet.router.base_url)
    assert counted(text, stage="output", action="stop", pack="house", rule="no-secret") >= 1


def test_interventions_reach_the_audit_log(
    fleet: Fleet, transactional_db: Any, settings: Any
) -> None:
    settings.SNAPSHOT_REDIS_PREFIX = f"{fleet.publisher.prefix}:snapshot"  # the router's ns
    tenant_create(actor=None, slug="payer", name="Payer", rpm_limit=100_000, tpm_limit=10**9,
                  max_concurrency=1000, max_context_tokens=4096,
                  max_output_tokens=512)  # fmt: skip
    message = [{"role": "user", "content": "a forbidden topic again"}]
    with pytest.raises(openai.BadRequestError):
        fleet.client().chat.completions.create(model=MODEL, messages=message, max_tokens=5)  # type: ignore[arg-type]

    def written() -> list[Intervention]:
        interventions_consume()
        return list(Intervention.objects.filter(action="refuse"))

    rows = eventually(written, timeout=15, what="the refusal in PostgreSQL")
    row = rows[0]
    assert (row.tenant.slug, row.stage, row.pack, row.rule) == ("payer", "input", "house",
                                                               "topic-ban")  # fmt: skip
    assert row.api_key == fleet.world.secrets["payer"].split("_")[1]
    audit = AuditEvent.objects.get(target_type="safety.intervention", target_id=str(row.pk))
    assert (audit.action, audit.actor_label) == ("safety.input.refuse", "system")
    assert "forbidden" not in msgspec.json.encode(audit.after).decode().lower()
    # The stream is drained, and a replay of the same event writes nothing twice.
    assert fleet.redis.xlen(safety_stream(fleet.publisher.prefix)) == 0
    total = Intervention.objects.count()
    replay = Event(tenant="payer", key=row.api_key, model=row.model, request_id=row.request_id,
                   stage="input", action="refuse", pack="house", rule="topic-ban")  # fmt: skip
    assert interventions_write(events=[replay]) == 0
    assert Intervention.objects.count() == total


def _payer(events: list[tuple[dict[str, Any], int]]) -> list[dict[str, Any]]:
    return [event for event, _charged in events if event["tenant"] == "payer"]


def _abort_count(sim: Process) -> float:
    status, body = http_get(f"{sim.base_url}/metrics")
    assert status == 200
    found = re.search(r'vllm:request_success_total\{[^}]*finished_reason="abort"[^}]*\} (\S+)',
                      body.decode())  # fmt: skip
    return float(found.group(1)) if found else 0.0
