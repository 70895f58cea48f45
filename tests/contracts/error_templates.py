"""The error-template rule, checked on the syntax tree: every ``ApiError.of(...)`` call names the
code (its one positional argument) and fills the table's template with keyword fields; none
passes a message of its own (a second positional argument or ``message=``), which would replace
the table's wording. The engine's own text or a limit's explanation travels as a field value
(``ApiError.of("upstream_error", reason=...)``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path


def _is_api_error_of(func: ast.expr) -> bool:
    return (
        isinstance(func, ast.Attribute)
        and func.attr == "of"
        and isinstance(func.value, ast.Name)
        and func.value.id == "ApiError"
    )


def free_text_calls(source: str, path: str) -> Iterator[str]:
    """``path:line: what`` for each ``ApiError.of`` call in ``source`` that passes a message."""
    for node in ast.walk(ast.parse(source, filename=path)):
        if not (isinstance(node, ast.Call) and _is_api_error_of(node.func)):
            continue
        extra_positional = len(node.args) > 1 or any(
            isinstance(arg, ast.Starred) for arg in node.args
        )
        if extra_positional or any(k.arg == "message" for k in node.keywords):
            yield f"{path}:{node.lineno}: {ast.unparse(node)[:120]}"


def check_tree(root: Path, packages: Iterable[str]) -> list[str]:
    """Every finding under ``root``'s ``packages``, as ``path:line: call``."""
    findings: list[str] = []
    for package in packages:
        for source in sorted((root / package).rglob("*.py")):
            rel = source.relative_to(root).as_posix()
            findings.extend(free_text_calls(source.read_text(encoding="utf-8"), rel))
    return findings
