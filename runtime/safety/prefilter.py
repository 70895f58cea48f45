"""The input pre-filter: pass, refuse (naming the rule) or redact a request's text.

Given the compiled packs in force (:meth:`runtime.safety.compiled.PackCache.packs_for`) and a
parsed request body, :func:`prefilter` finds the text a model will read (chat messages'
``content``, as a string or a list of content parts; completions' ``prompt``, a string or a
list of strings; embeddings' ``input``) and decides:

- ``refuse``: a ``refuse`` rule of any pack matched the original text; the verdict names the
  pack and rule, never the text (:func:`refusal_body` is the OpenAI-style 400);
- ``redact``: ``redact`` rules matched; ``Verdict.body`` is a copy of the request with every
  match replaced by ``[REDACTED:<detector or rule>]`` (what is not text is left as it was);
- ``pass``: nothing matched; the body is the caller's, untouched.

Classifier rules need a model call; :mod:`runtime.safety.classify` does them after this.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from runtime.safety.compiled import CompiledPack

Path = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Verdict:
    action: str  # "pass" | "refuse" | "redact"
    pack: str = ""  # refuse: the pack and rule that matched
    rule: str = ""
    body: dict[str, Any] | None = None  # redact: the rewritten request
    redacted: tuple[tuple[str, str, int], ...] = ()  # redact: (pack, rule, matches) per rule
    failed: str = ""  # classifier down: "open" or "closed" (what the policy did)


PASS = Verdict("pass")


def text_parts(body: dict[str, Any]) -> Iterator[tuple[Path, str]]:
    """Every text a model reads in ``body``, with where it is (a path of keys and indexes)."""
    messages = body.get("messages")
    if isinstance(messages, list):
        for i, message in enumerate(messages):
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                yield ("messages", i, "content"), content
            elif isinstance(content, list):
                for j, part in enumerate(content):
                    if isinstance(part, dict) and isinstance(part.get("text"), str):
                        yield ("messages", i, "content", j, "text"), part["text"]
    for key in ("prompt", "input"):
        value = body.get(key)
        if isinstance(value, str):
            yield (key,), value
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, str):
                    yield (key, i), item


def _replaced(node: Any, path: Path, value: str) -> Any:
    """A copy of ``node`` with ``value`` at ``path``; only the containers on the path copied."""
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(node, dict):
        copy: dict[Any, Any] = dict(node)
        copy[head] = _replaced(node[head], rest, value)
        return copy
    items = list(node)
    assert isinstance(head, int)
    items[head] = _replaced(items[head], rest, value)
    return items


def prefilter(packs: Sequence[CompiledPack], body: dict[str, Any]) -> Verdict:
    """Refuse, redact or pass ``body`` under ``packs`` (refuse rules win over redact rules)."""
    if not packs:
        return PASS
    parts = list(text_parts(body))
    for pack in packs:
        if not pack.refuse.active:
            continue
        for _, text in parts:
            hit = pack.refuse.first(text)
            if hit is not None:
                return Verdict("refuse", pack=hit.pack, rule=hit.rule)
    counts: dict[tuple[str, str], int] = {}
    changed: dict[Path, str] = {}
    for pack in packs:
        if not pack.redact.active:
            continue
        for path, original in parts:
            text = changed.get(path, original)
            new, hits = pack.redact.redact(text)
            if hits:
                changed[path] = new
                for hit in hits:
                    counts[hit.pack, hit.rule] = counts.get((hit.pack, hit.rule), 0) + 1
    if not changed:
        return PASS
    rewritten: Any = body
    for path, text in changed.items():
        rewritten = _replaced(rewritten, path, text)
    redacted = tuple((pack, rule, n) for (pack, rule), n in counts.items())
    return Verdict("redact", body=rewritten, redacted=redacted)


def refusal_body(verdict: Verdict) -> dict[str, Any]:
    """The OpenAI-style 400 body of a refusal: the pack and rule, never the matched text."""
    how = " (the classifier was unavailable)" if verdict.failed == "closed" else ""
    return {
        "error": {
            "message": f"The request was refused by content policy {verdict.pack!r}, "
            f"rule {verdict.rule!r}{how}.",
            "type": "invalid_request_error",
            "param": None,
            "code": "content_policy_violation",
        }
    }
