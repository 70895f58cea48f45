"""Fuzz suite fixtures; the helpers live in ``fuzz_target`` (a unique module name)."""

from fuzz_target import target

__all__ = ["target"]
