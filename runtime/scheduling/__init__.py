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
- :mod:`.metrics` — entitled versus served share, Jain's index, max service gap.
"""
