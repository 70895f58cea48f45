"""The query result cache (docs/design.md): deterministic completions served again, no engine.

- :mod:`.policy` — what is cacheable, and the key;
- :mod:`.entry` — a stored completion and its replay as JSON or as OpenAI SSE;
- :mod:`.store` — L1 (in-process W-TinyLFU, bounded in bytes) over L2 (Redis, TTL, per-tenant
  byte quota);
- :mod:`.flight` — single flight: one upstream request per key, within and across routers;
- :mod:`.idempotency` — ``Idempotency-Key`` (Stripe's semantics);
- :mod:`.purge` — purge by tenant or model version;
- :mod:`.gateway` — the glue the inference route calls.
"""
