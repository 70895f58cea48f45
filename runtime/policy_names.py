"""Policies chosen by name: the one error for an unknown name, and the name → class table.

Scheduling (:mod:`runtime.scheduling.registry`) and routing (:mod:`runtime.routing.endpoints`)
keep their implementations as tuples of classes with a ``name`` attribute; :func:`by_name`
turns such a tuple into a read-only table and :func:`lookup` finds a class in it. The control
plane validates a pool's ``policies`` against the same tables
(:mod:`runtime.pool_policies`), so a name is refused where it is written.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any


class UnknownPolicyError(ValueError):
    """A policy name (or interface) that is not registered; the message lists the known ones."""


def by_name(what: str, classes: Iterable[type[Any]]) -> Mapping[str, type[Any]]:
    """The read-only ``name -> class`` table of ``classes``; two classes with one name raise."""
    table: dict[str, type[Any]] = {}
    for cls in classes:
        name: str = cls.name
        if name in table:
            raise UnknownPolicyError(f"two {what} policies are named {name!r}")
        table[name] = cls
    return MappingProxyType(table)


def lookup(what: str, table: Mapping[str, type[Any]], name: str) -> type[Any]:
    """The class registered as ``name`` (surrounding blanks ignored), else UnknownPolicyError."""
    cls = table.get(name.strip())
    if cls is None:
        known = ", ".join(sorted(table))
        raise UnknownPolicyError(f"unknown {what} {name!r} (known: {known})")
    return cls
