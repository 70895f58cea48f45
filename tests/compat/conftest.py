"""Compatibility suite fixtures; the helpers live in ``compat_ways`` (a unique module name)."""

from compat_ways import direct, routed, ways

__all__ = ["direct", "routed", "ways"]
