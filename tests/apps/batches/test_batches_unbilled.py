"""A done batch line whose usage event the ledger never got (Redis lost the stream's tail) is
charged from the usage recorded with its answer, under the line's own event id, once
(apps/batches/services/unbilled.py). Real PostgreSQL and Redis (the usage stream)."""

from __future__ import annotations

import time
from datetime import timedelta
from decimal import Decimal
from typing import Any

import pytest
import redis
from batch_support import MODEL, Signed, jsonl, line
from django.utils import timezone
from fixtures.control_plane import endpoint_ready
from fixtures.redis_keys import RouterNamespace

from apps.batches import executor
from apps.batches.models import BatchLine
from apps.batches.services import line_record, lines_claim
from apps.batches.services.unbilled import lines_bill_missing
from apps.billing import ledger
from apps.billing.models import CreditAccount, UsageRecord
from apps.billing.services import price_set
from apps.models.models import Model, ModelVersion
from apps.models.services import model_version_create, model_version_publish, pool_create
from apps.tenants.models import Tenant
from runtime.artifacts import manifest_digest
from runtime.contract import usage_stream
from runtime.internal_principal import line_event_id
from runtime.metering.events import UsageEvent, encode_event

pytestmark = [pytest.mark.integration, pytest.mark.django_db]

GRACE_S = 60.0
# 10 prompt tokens at 1 credit / 1k and 20 completion tokens at 2 credits / 1k
CHARGE = Decimal("0.050000")


@pytest.fixture
def priced(tenant: Tenant, settings: Any, router_namespace: RouterNamespace) -> Tenant:
    """The conftest's tenant and model, with a published version priced on its one tier."""
    settings.BATCH_BILL_GRACE_S = GRACE_S
    files = {"model.safetensors": "cd" * 32}
    draft = model_version_create(
        actor=None, model=Model.objects.get(name=MODEL), label="v1",
        artifact_uri="file:///models/batch-chat/v1", digest=manifest_digest(files),
        manifest={"tokenizer": "tok", "max_context": 2048, "default_sampling": {},
                  "files": files}, runtime="vllm",
    )  # fmt: skip
    version = model_version_publish(actor=None, version=draft)
    price_set(actor=None, version=version, hardware_tier="cpu", input_per_1k="1",
              output_per_1k="2")  # fmt: skip
    return tenant


def _done_lines(n: int, *, finished_s_ago: float) -> list[BatchLine]:
    """A batch of ``n`` lines, each answered (as the executor records it) that long ago."""
    acme = Signed("acme")
    uploaded = acme.upload(jsonl(*(line(f"c{i}") for i in range(n)))).json()
    created = acme.post_json(
        "/v1/batches",
        {
            "input_file_id": uploaded["id"],
            "endpoint": "/v1/chat/completions",
            "completion_window": "24h",
        },
    )
    assert created.status_code == 200, created.content
    answer = executor.Answer(200, {"usage": {"prompt_tokens": 10, "completion_tokens": 20}},
                             {"x-switchyard-version": "v1"})  # fmt: skip
    for claimed in lines_claim(owner="w1", limit=n, lease_s=60):
        assert line_record(line_id=claimed.pk, owner="w1", status_code=200, body=answer.body,
                           request_id="r", usage_event_id=line_event_id(str(claimed.pk)),
                           usage=executor.answer_usage(claimed, answer, "batch"))  # fmt: skip
    BatchLine.objects.update(finished_at=timezone.now() - timedelta(seconds=finished_s_ago))
    return list(BatchLine.objects.order_by("number"))


def _balance(tenant: Tenant) -> Decimal:
    account, _ = CreditAccount.objects.get_or_create(tenant=tenant)
    return account.balance


def _stream_event(client: redis.Redis[bytes], done: BatchLine, tenant: Tenant) -> None:
    """The router's event for the line, still waiting in the usage stream."""
    event = UsageEvent(
        id=done.usage_event_id, tenant=tenant.slug, api_key="k", version=0, endpoint=None,
        tier="cpu", request_class="batch", tokens_in=10, tokens_out=20, cost_uc=50_000,
        cached=False, outcome="ok", occurred_at=time.time(),
    )  # fmt: skip
    client.xadd(usage_stream(ledger.namespace()), {"event": encode_event(event),
                                                   "charged": b"50000"})  # fmt: skip


def test_a_line_whose_event_was_lost_is_charged_once_from_its_answer(priced: Tenant) -> None:
    (done,) = _done_lines(1, finished_s_ago=GRACE_S + 5)
    assert done.usage == {"model": MODEL, "version": "v1", "request_class": "batch",
                          "tokens_in": 10, "tokens_out": 20, "cached": False}  # fmt: skip
    before = _balance(priced)

    assert lines_bill_missing() == [done.usage_event_id]
    record = UsageRecord.objects.get(event_id=done.usage_event_id)
    assert (record.tokens_in, record.tokens_out, record.credits) == (10, 20, CHARGE)
    assert (record.request_class, record.outcome) == ("batch", "ok")
    assert _balance(priced) == before - CHARGE
    assert lines_bill_missing() == []  # idempotent: the ledger has it now
    assert _balance(priced) == before - CHARGE


def test_a_late_stream_record_after_the_repair_is_not_charged_again(
    priced: Tenant, redis_client: redis.Redis[bytes]
) -> None:
    (done,) = _done_lines(1, finished_s_ago=GRACE_S + 5)
    before = _balance(priced)
    assert lines_bill_missing() == [done.usage_event_id]
    _stream_event(redis_client, done, priced)  # e.g. a router's spool flushed late
    assert ledger.usage_consume(client=redis_client) == 1
    assert UsageRecord.objects.filter(event_id=done.usage_event_id).count() == 1
    assert _balance(priced) == before - CHARGE


def test_lines_within_the_grace_or_with_their_event_in_the_stream_are_left_to_the_consumer(
    priced: Tenant, redis_client: redis.Redis[bytes]
) -> None:
    waiting, recent = _done_lines(2, finished_s_ago=GRACE_S + 5)
    BatchLine.objects.filter(pk=recent.pk).update(finished_at=timezone.now())
    _stream_event(redis_client, waiting, priced)
    before = _balance(priced)
    assert lines_bill_missing() == []  # one is waiting for the consumer, one is too recent
    assert ledger.usage_consume(client=redis_client) == 1
    assert lines_bill_missing() == []
    assert UsageRecord.objects.filter(event_id=waiting.usage_event_id).count() == 1
    assert _balance(priced) == before - CHARGE


def test_the_charge_is_the_price_on_the_tier_of_the_versions_pool_and_a_cached_answer_is_discounted(
    priced: Tenant,
) -> None:
    version = ModelVersion.objects.get(model__name=MODEL, label="v1")
    price_set(actor=None, version=version, hardware_tier="gpu", input_per_1k="10",
              output_per_1k="20", cache_hit_discount="0.5")  # fmt: skip
    gpu = pool_create(actor=None, name="gpus", hardware_tier="gpu", cost_per_replica_hour="1")
    endpoint_ready(gpu, version, "http://127.0.0.1:9/")
    plain, cached = _done_lines(2, finished_s_ago=GRACE_S + 5)
    BatchLine.objects.filter(pk=cached.pk).update(usage={**(cached.usage or {}), "cached": True})
    assert sorted(lines_bill_missing()) == sorted([plain.usage_event_id, cached.usage_event_id])
    charged = dict(UsageRecord.objects.values_list("event_id", "credits"))
    assert charged[plain.usage_event_id] == CHARGE * 10  # the gpu price, not the cpu one
    assert charged[cached.usage_event_id] == CHARGE * 5  # half off: a cache hit


def test_the_charge_is_at_the_batch_rate_the_prices_batch_discount_off(priced: Tenant) -> None:
    """The repair charges what the router charges a line (sent with its batch's key): the
    price less its batch discount, with the cache-hit discount on top for a cached answer."""
    version = ModelVersion.objects.get(model__name=MODEL, label="v1")
    price_set(actor=None, version=version, hardware_tier="cpu", input_per_1k="1",
              output_per_1k="2", cache_hit_discount="0.5", batch_discount="0.25")  # fmt: skip
    plain, cached = _done_lines(2, finished_s_ago=GRACE_S + 5)
    BatchLine.objects.filter(pk=cached.pk).update(usage={**(cached.usage or {}), "cached": True})
    assert sorted(lines_bill_missing()) == sorted([plain.usage_event_id, cached.usage_event_id])
    charged = dict(UsageRecord.objects.values_list("event_id", "credits"))
    assert charged[plain.usage_event_id] == CHARGE * Decimal("0.75")
    assert charged[cached.usage_event_id] == CHARGE * Decimal("0.75") * Decimal("0.5")
