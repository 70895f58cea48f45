"""Metering: token usage -> credits -> usage events (docs/design.md).

- :mod:`.pricing` — the price book built from the snapshot: micro-credits per token of a
  version on a hardware tier, and the cost of a request (worst case at admission, actual at
  settlement);
- :mod:`.keys` — the Redis key names the routers and the control plane share (balances,
  escrow, the usage stream);
- :mod:`.events` — the usage event appended to the stream, one per request that reached an
  engine;
- :mod:`.spool` — the append-only local file every settlement is written to before Redis
  sees it, replayed after a crash or a Redis outage.

Amounts in Redis and on the stream are integer **micro-credits** (1 credit = 1,000,000 µc),
matching the ledger's six decimal places, so Redis arithmetic is exact.
"""
