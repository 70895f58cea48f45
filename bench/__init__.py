"""Switchyard's benchmark harness (not part of the installed distribution): see README.md."""
