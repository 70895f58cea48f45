"""A tiny reader for the Prometheus text format: sums of the few gauges we need.

Only sample lines whose metric name is asked for are looked at; label values may hold any
character (quotes and braces included, escaped as the format says). Comments, other metrics
and unparsable values are skipped: a scrape is best effort, never an exception.
"""

from __future__ import annotations

import math
from collections.abc import Collection


def _label_end(line: str, start: int) -> int:
    """Index just past the ``}`` closing the label set opened at ``start``; -1 if none."""
    in_quotes = False
    i = start + 1
    n = len(line)
    while i < n:
        ch = line[i]
        if in_quotes:
            if ch == "\\":
                i += 1
            elif ch == '"':
                in_quotes = False
        elif ch == '"':
            in_quotes = True
        elif ch == "}":
            return i + 1
        i += 1
    return -1


def _value(line: str) -> float | None:
    """The sample value of ``line``, which starts right after the metric name."""
    rest_at = 0
    if line.startswith("{"):
        rest_at = _label_end(line, 0)
        if rest_at < 0:
            return None
    fields = line[rest_at:].split()
    if not fields:
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    return None if math.isnan(value) else value


def parse_samples(text: str, names: Collection[str]) -> dict[str, list[float]]:
    """Every value of each asked-for metric, one per label set, in order of appearance.

    Scans for the names with ``str.find`` (vLLM's /metrics runs to thousands of histogram
    lines; we read a handful of gauges, four times a second, per endpoint).
    """
    found: dict[str, list[float]] = {}
    for name in names:
        pos = text.find(name)
        while pos >= 0:
            after = pos + len(name)
            at_line_start = pos == 0 or text[pos - 1] == "\n"
            if at_line_start and text[after : after + 1] in ("{", " ", "\t"):
                end = text.find("\n", after)
                value = _value(text[after : end if end >= 0 else len(text)].rstrip("\r"))
                if value is not None:
                    found.setdefault(name, []).append(value)
            pos = text.find(name, after)
    return found
