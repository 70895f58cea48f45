"""Classifier rules: a registered model scores the text; a score at or above the threshold matches.

The gateway provides a :class:`Classifier` (it calls the model through the router, e.g. the
encoder worker); this module applies the rules' thresholds and their ``fail_open`` setting when
the model cannot answer (any exception from :meth:`Classifier.score`, timeouts included).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from runtime.safety.compiled import CompiledPack
from runtime.safety.prefilter import PASS, Verdict
from runtime.snapshot import SafetyRuleSnap


class Classifier(Protocol):
    async def score(self, model: str, text: str) -> float:
        """The model's score for ``text`` (0..1, higher = more likely to violate)."""
        ...


async def classify(
    packs: Sequence[CompiledPack], text: str, classifier: Classifier, *, output: bool = False
) -> Verdict:
    """Check ``text`` against the packs' classifier rules (input rules, or output ones).

    The first rule that matches, or whose model is down with ``fail_open`` False, gives a
    ``refuse`` verdict (for output rules: the caller stops the answer); a model that is down
    with ``fail_open`` True passes and the verdict says ``failed="open"``.
    """
    failed_open: Verdict | None = None
    for pack in packs:
        rules: tuple[SafetyRuleSnap, ...] = pack.classify_output if output else pack.classify_input
        for rule in rules:
            try:
                score = await classifier.score(rule.model, text)
            except Exception:  # any failure of the model is "down" (cancellation is not)
                if not rule.fail_open:
                    return Verdict("refuse", pack=pack.name, rule=rule.id, failed="closed")
                failed_open = failed_open or Verdict("pass", pack=pack.name, rule=rule.id,
                                                     failed="open")  # fmt: skip
                continue
            if score >= rule.threshold:
                return Verdict("refuse", pack=pack.name, rule=rule.id)
    return failed_open or PASS
