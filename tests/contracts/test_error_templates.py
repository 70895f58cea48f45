"""Every ``ApiError.of`` in the data plane fills the error table's template (issue 27, must-have
5): no call passes its own message. Shown to fail on snippets that do."""

from __future__ import annotations

from pathlib import Path

import pytest
from error_templates import check_tree, free_text_calls

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]

# "path: call prefix" -> why. Shrinks only.
ALLOWED: dict[str, str] = {
    "runtime/gateway/errors.py: ApiError.of('upstream_rejected', message,": (
        "an engine's 4xx is passed back with the engine's own message verbatim (OpenAI clients "
        "show it); the table's template is the fallback when the engine's body has none"
    ),
}


def _key(finding: str) -> str:
    """``path: call`` of a ``path:line: call`` finding (line numbers move)."""
    path, _, rest = finding.partition(":")
    return f"{path}: {rest.partition(': ')[2]}"


def test_every_api_error_of_fills_the_template() -> None:
    keys = [_key(f) for f in check_tree(REPO, ("runtime",))]
    assert [k for k in keys if not any(k.startswith(e) for e in ALLOWED)] == []
    stale = [e for e in ALLOWED if not any(k.startswith(e) for k in keys)]
    assert stale == [], f"allow-list entries whose call is gone: {stale}"


@pytest.mark.parametrize(
    "snippet",
    [
        'raise ApiError.of("upstream_error", "The model server failed.")',
        'raise ApiError.of(code, str(exc), headers=h)',
        'raise ApiError.of("not_ready", message="not yet")',
        'raise ApiError.of("invalid_value", *parts)',
    ],
)
def test_a_free_text_message_is_found(snippet: str) -> None:
    assert len(list(free_text_calls(snippet, "x.py"))) == 1


@pytest.mark.parametrize(
    "snippet",
    [
        'raise ApiError.of("upstream_error", reason=str(exc))',
        'raise ApiError.of(code, reason=str(exc), headers=h, extra={"a": 1})',
        'raise ApiError.of("not_ready")',
        'other.of("x", "y")',
    ],
)
def test_a_filled_template_passes(snippet: str) -> None:
    assert list(free_text_calls(snippet, "x.py")) == []


def test_the_check_fails_on_a_tree_that_breaks_the_rule(tmp_path: Path) -> None:
    module = tmp_path / "runtime" / "gateway" / "bad.py"
    module.parent.mkdir(parents=True)
    module.write_text('def f():\n    raise ApiError.of("shed", "busy")\n')
    assert check_tree(tmp_path, ("runtime",)) == [
        "runtime/gateway/bad.py:2: ApiError.of('shed', 'busy')"
    ]
