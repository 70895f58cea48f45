"""Per-pool request queues: priority bands, fair share across tenants, order within a tenant.

Modules (nothing runs at import time; every policy's state is an explicit object):

- :mod:`.interfaces` — :class:`QueuedRequest` and the policy protocols;
- :mod:`.fairness` — which backlogged tenant goes next (VTC, FCFS, round robin);
- :mod:`.ordering` — which of a tenant's requests goes next (EDF, FCFS);
- :mod:`.saturation` — whether an endpoint has room for one more request;
- :mod:`.registry` — the implementations by name, chosen per pool from the snapshot;
- :mod:`.queue` — :class:`~.queue.PoolQueue`: bands, tenants, requests; bounds, expiry, shedding;
- :mod:`.shares` — strict priority with a guaranteed minimum share per lower band (the rule);
- :mod:`.estimate` — work ahead of a request (position in queue);
- :mod:`.drain` — drain-rate estimate, estimated wait, ``Retry-After``;
- :mod:`.admission` — deadline-aware admission decision (429 with position and Retry-After);
- :mod:`.metrics` — entitled versus served share, Jain's index, max service gap;
- :mod:`.settings` — a pool's scheduling settings from its snapshot policies and the classes;
- :mod:`.grant` — what a request gives the dispatcher (``Ticket``) and gets (``Grant``);
- :mod:`.ports` — what the dispatcher needs from the router (``Placement``, ``CounterSink``);
- :mod:`.headroom` — slots kept for tenants below their share (latency isolation);
- :mod:`.dispatcher` — :class:`~.dispatcher.PoolDispatcher`: the queue in front of a pool's
  endpoints, releasing requests as endpoints have room;
- :mod:`.pools` — every pool's dispatcher, built on first use, updated on snapshot swaps;
- :mod:`.placement` — the fleet as the dispatcher sees it (routing table, health, in-flight);
- :mod:`.served` — served tokens per tenant, recent shares and Jain's index for metrics;
- :mod:`.shared` — fairness counters shared by router replicas through Redis, in batches.
"""
