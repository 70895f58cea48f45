"""Source rules import-linter cannot express, checked on the syntax tree of each module.

- **Redis clients** are built only by ``runtime/redis_conn.py``: a call of ``Redis(...)``,
  ``StrictRedis(...)``, ``RedisCluster(...)``, ``ConnectionPool(...)``, ``*.from_url(...)`` or
  ``*.from_pool(...)`` anywhere else is a finding (whatever it is called through:
  ``aioredis.Redis.from_url``, ``redis.Redis``, an alias).
- **Redis key names** are spelled only in ``runtime/contract.py``: a string *shaped like a key*
  elsewhere is a finding. Shapes (the layout in ``contract.py`` is ``{ns}:<segment>:...``):

  - an f-string in which an interpolated value is followed by ``:<word>`` (``f"{ns}:live"``,
    ``f"{self._prefix}:cache:e:"``): a name under a namespace or prefix;
  - a literal ``":<word>..."`` concatenated with ``+`` (``ns + ":limits"``) or a template
    ``"{...}:<word>"`` / ``"%s:<word>"`` formatted with ``.format`` / ``%``;
  - ``":".join(...)`` of a sequence holding a literal ``<word>`` (``":".join((ns, "live"))``);
  - any literal that starts with the default namespace (``"switchyard:..."``).

  ``<word>`` is a lower-case identifier (``live``, ``ledger-lock``) making a whole segment:
  ``f"{host}:{port}"``, ``f"{name}: failed"``, ``f"{grant}:r{i}"`` and URLs are not keys.
  Docstrings are not looked at.

Each finding is ``path:line: rule: what``; the callers keep an explicit allow-list of the ones
that are someone else's to move.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

NAMESPACE = "switchyard"
CLIENT_CONSTRUCTORS = frozenset({"Redis", "StrictRedis", "RedisCluster", "ConnectionPool"})
CLIENT_FACTORIES = frozenset({"from_url", "from_pool"})

_WORD = r"[a-z][a-z0-9_-]*"
_AFTER_VALUE = re.compile(rf":{_WORD}(?::|$)")  # the literal right after an interpolated value
_TEMPLATE = re.compile(rf"(?:\{{[^{{}}]*\}}|%[sr]):{_WORD}(?::|$)")  # "{}:live", "%s:live"
_NAMESPACED = re.compile(rf"{NAMESPACE}:{_WORD}")
_SEGMENT = re.compile(rf"{_WORD}")


@dataclass(frozen=True, slots=True)
class Finding:
    path: str
    line: int
    rule: str  # "redis-client" | "redis-key"
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.rule}: {self.what}"


def _callee_name(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the constant nodes that are docstrings (a body's first bare string)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _fstring_key(node: ast.JoinedStr) -> str | None:
    """The key-shaped literal of an f-string (after an interpolated value), or None."""
    values = node.values
    for i in range(1, len(values)):
        before, part = values[i - 1], values[i]
        if not (isinstance(before, ast.FormattedValue) and isinstance(part, ast.Constant)):
            continue
        text = part.value
        match = _AFTER_VALUE.match(text) if isinstance(text, str) else None
        # ``:<word>`` must be a whole segment: followed by ``:`` or ending the string, not the
        # start of a value (``f"{grant}:r{i}"`` is an entry id, not a name under ``grant``).
        if match and (match.group().endswith(":") or i == len(values) - 1):
            return str(text)
    return None


def _str(node: ast.expr) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


class _Visitor(ast.NodeVisitor):
    def __init__(self, path: str, tree: ast.AST) -> None:
        self.path = path
        self.docstrings = _docstrings(tree)
        self.findings: list[Finding] = []

    def _add(self, node: ast.AST, rule: str, what: str) -> None:
        self.findings.append(Finding(self.path, getattr(node, "lineno", 0), rule, what))

    def visit_Call(self, node: ast.Call) -> None:
        name = _callee_name(node.func)
        if name in CLIENT_CONSTRUCTORS or name in CLIENT_FACTORIES:
            self._add(node, "redis-client", f"{ast.unparse(node.func)}(...)")
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr == "format"
            and (template := _str(node.func.value)) is not None
            and _TEMPLATE.search(template)
        ):
            self._add(node, "redis-key", f"{template!r}.format(...)")
        if (
            isinstance(node.func, ast.Attribute)
            and node.func.attr == "join"
            and _str(node.func.value) == ":"
            and node.args
            and isinstance(node.args[0], ast.List | ast.Tuple)
            and any(
                (text := _str(e)) is not None and _SEGMENT.fullmatch(text)
                for e in node.args[0].elts
            )
        ):
            self._add(node, "redis-key", ast.unparse(node))
        self.generic_visit(node)

    def visit_BinOp(self, node: ast.BinOp) -> None:
        if isinstance(node.op, ast.Add):
            for side in (node.left, node.right):
                text = _str(side)
                if text is not None and _AFTER_VALUE.match(text):
                    self._add(node, "redis-key", f"... + {text!r}")
        elif isinstance(node.op, ast.Mod):
            text = _str(node.left)
            if text is not None and _TEMPLATE.search(text):
                self._add(node, "redis-key", f"{text!r} % ...")
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        shape = _fstring_key(node)
        if shape is not None:
            self._add(node, "redis-key", ast.unparse(node))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        if (
            isinstance(node.value, str)
            and id(node) not in self.docstrings
            and _NAMESPACED.match(node.value)
        ):
            self._add(node, "redis-key", repr(node.value))


def check_source(source: str, path: str = "<string>") -> list[Finding]:
    """Every finding in one module's source."""
    tree = ast.parse(source, filename=path)
    visitor = _Visitor(path, tree)
    visitor.visit(tree)
    return visitor.findings


def python_files(root: Path, folders: Iterable[str]) -> Iterator[Path]:
    for folder in folders:
        yield from sorted((root / folder).rglob("*.py"))


def check_tree(root: Path, folders: Iterable[str], *, exempt: dict[str, str]) -> list[Finding]:
    """Findings under ``folders`` of ``root``; ``exempt`` maps a path (relative to root) to the
    one rule it may break (its own job: ``redis_conn.py`` builds clients)."""
    out: list[Finding] = []
    for file in python_files(root, folders):
        rel = file.relative_to(root).as_posix()
        findings = check_source(file.read_text(encoding="utf-8"), rel)
        out.extend(f for f in findings if exempt.get(rel) != f.rule)
    return out
