"""A LoRA adapter is billed at its own price: through a real router and a simulator with the
simulator's LoRA API, a request for the adapter runs on its base's replica but its usage event
names the adapter's version, and its cost and the credit ledger's charge are the adapter's
token prices, not the base's."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import msgspec
import pytest
import redis
from fixtures.router import World, redis_url, routers, start_simulator, wait_ready
from fixtures.wait import eventually
from integration_support import tenant_limits

from runtime.artifacts import write_manifest
from runtime.contract import credit_key
from runtime.metering.events import decode_event
from runtime.snapshot import PriceSnap

pytestmark = pytest.mark.integration

BASE = "billed-base"
ADAPTER = f"{BASE}-lora"
# Micro-credits per token (in, out): the base 1,000 / 2,000, the adapter 3,000 / 5,000.
RATES = {1: (1000, 2000), 2: (3000, 5000)}
PRICES = tuple(
    PriceSnap(version=v, hardware_tier="cpu", input_per_1k=i / 1000, output_per_1k=o / 1000)
    for v, (i, o) in RATES.items()
)
FUNDS = 10_000_000


def _adapter_folder(root: Path) -> tuple[str, str]:
    folder = root / "adapter"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8}), encoding="utf-8")
    digest, _ = write_manifest(folder)
    return folder.as_uri(), digest


def test_an_adapter_is_billed_at_its_own_price(tmp_path: Path) -> None:
    sim = start_simulator(BASE, "--max-loras", "2", "--lora-load-ms", "20")
    try:
        world = World()
        world.add_tenant("payer", tenant_limits=tenant_limits())
        world.add_key("payer", "payer")
        world.add_model(BASE, 1)
        uri, digest = _adapter_folder(tmp_path)
        world.add_adapter(ADAPTER, 2, base_version=1, artifact_uri=uri, digest=digest, label="v1")
        world.add_endpoint(1, 1, sim.base_url, pool="cpu", capacity=16)
        with routers(world, tmp_path) as ([router], publisher):
            wait_ready(router, publisher.publish(msgspec.structs.replace(
                world.snapshot(), prices=PRICES)))  # fmt: skip
            store: redis.Redis[bytes] = redis.Redis.from_url(redis_url())
            limits = credit_key(f"{publisher.prefix}:limits", "payer")
            store.hset(limits, "balance", FUNDS)
            headers = {"Authorization": f"Bearer {world.secrets['payer']}"}
            usage = {}
            for model in (BASE, ADAPTER):
                body = {"model": model, "max_tokens": 8,
                        "messages": [{"role": "user", "content": "count to eight"}]}  # fmt: skip
                answer = httpx.post(f"{router.base_url}/v1/chat/completions", json=body,
                                    headers=headers, timeout=30)  # fmt: skip
                assert answer.status_code == 200, answer.text
                usage[model] = answer.json()["usage"]

            def events() -> list[tuple[dict[str, object], int]]:
                rows = store.xrange(f"{publisher.prefix}:usage")
                return [(msgspec.to_builtins(decode_event(f[b"event"])), int(f[b"charged"]))
                        for _id, f in rows]  # fmt: skip

            found = eventually(lambda: len(events()) == 2 and events(), timeout=10,
                               what="two usage events")  # fmt: skip
            by_version = {int(e["version"]): (e, charged) for e, charged in found}
            assert sorted(by_version) == [1, 2]  # the adapter's event names its own version
            for version, model in ((1, BASE), (2, ADAPTER)):
                event, charged = by_version[version]
                per_in, per_out = RATES[version]
                tokens_in = usage[model]["prompt_tokens"]
                tokens_out = usage[model]["completion_tokens"]
                assert (event["tokens_in"], event["tokens_out"]) == (tokens_in, tokens_out)
                assert event["cost_uc"] == charged == tokens_in * per_in + tokens_out * per_out
                assert event["endpoint"] == 1  # the base's replica served the adapter
            state = eventually(
                lambda: store.hgetall(limits).get(b"escrow") == b"0" and store.hgetall(limits),
                timeout=10, what="escrow released",
            )  # fmt: skip
            assert int(state[b"balance"]) == FUNDS - sum(c for _e, c in found)
            store.close()
    finally:
        sim.stop()
