"""Version choice: the model's route split, sticky by a stable hash, or its newest version.

The sticky value is the tenant, the request's ``user`` field (``RouteSnap.sticky_key``) or,
while a rollout names one (``RouteSnap.sticky_header``), that request header's value (a request
without the header falls back to the route's key). Stickiness hashes
``"{model}\\0{sticky value}"`` with sha256 (not ``hash()``, which is salted
per process), so every router replica sends a tenant (or user) to the same version. A key's
point in ``[0, total)`` depends only on the key and the total weight, so with weights that
keep their sum (percentages), growing the last split's share (a canary step) only moves keys
onto it, never between the others.

A running rollout's blast-radius limit rides on the route: tenants in ``exclude_tenants``
always get ``stable_version`` (when the snapshot knows it), whatever the split says.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterable

from runtime.snapshot import ModelSnap, RouteSnap, Snapshot, VersionSnap


class NoVersionError(LookupError):
    """The model has no published version the route can send traffic to."""


def sticky_point(model: str, key: str, total: int) -> int:
    """A point in ``[0, total)`` derived only from ``model`` and ``key``."""
    digest = hashlib.sha256(f"{model}\0{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % total


Headers = Iterable[tuple[bytes, bytes]]  # ASGI: lower-case names


def header_value(headers: Headers, name: str) -> str | None:
    """The first non-empty value of header ``name`` (lower case), or None."""
    wanted = name.encode("latin-1")
    for key, value in headers:
        if key == wanted:
            text = bytes(value).decode("latin-1").strip()
            return text or None
    return None


def sticky_value(
    route: RouteSnap | None, *, tenant: str, user: str | None, headers: Headers = ()
) -> str | None:
    """The value the route is sticky on, or None for a fresh draw per request."""
    if route is None:
        return tenant
    if route.sticky_header:
        value = header_value(headers, route.sticky_header)
        if value is not None:
            return value
    if route.sticky_key == "none":
        return None
    if route.sticky_key == "user" and user:
        return user
    return tenant


def choose_version(
    snapshot: Snapshot,
    model: ModelSnap,
    *,
    tenant: str,
    user: str | None = None,
    headers: Headers = (),
    rng: random.Random | None = None,
) -> VersionSnap:
    """The version that serves this request.

    A tenant the route excludes (a rollout's blast-radius limit) gets the route's stable
    version. With a route: its splits with positive weight over versions the snapshot knows,
    picked by the sticky point (or ``rng`` when the route is not sticky). Without one (or when
    no split is usable): the model's newest published version (``ModelSnap.versions[-1]``).
    """
    route = snapshot.routes.get(model.name)
    if route is not None and route.exclude_tenants and tenant in route.exclude_tenants:
        stable = snapshot.versions.get(route.stable_version or -1)
        if stable is not None:
            return stable
    if route is not None:
        splits = [
            (s.version, s.weight)
            for s in route.splits
            if s.weight > 0 and s.version in snapshot.versions
        ]
        total = sum(weight for _, weight in splits)
        if total > 0:
            key = sticky_value(route, tenant=tenant, user=user, headers=headers)
            if key is None:
                draw = rng.randrange if rng is not None else random.randrange
                point = draw(total)
            else:
                point = sticky_point(model.name, key, total)
            for version_id, weight in splits:
                if point < weight:
                    return snapshot.versions[version_id]
                point -= weight
    for version_id in reversed(model.versions):
        version = snapshot.versions.get(version_id)
        if version is not None:
            return version
    raise NoVersionError(f"model {model.name!r} has no published version")
