"""Gateway test fixtures; the helpers live in ``gateway_fleet`` (a unique module name)."""

from gateway_fleet import fleet, publisher, var_dir

__all__ = ["fleet", "publisher", "var_dir"]
