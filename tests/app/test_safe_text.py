"""md_text / md_code: hostile values become inert text that reads exactly as written."""

from __future__ import annotations

import pytest

from app_ui.safe_text import md_code, md_text, shown
from tests.app.markup import active_markup

HOSTILE = (
    "[click me](http://evil.example/phish)",
    "![i](http://evil.example/i.png)",
    '<img src="http://evil.example/h.png">',
    "<http://evil.example/auto>",
    "http://evil.example/bare",
    "www.evil.example",
    "someone@evil.example",
    "[ref]\n\n[ref]: http://evil.example/ref",
    "a` ![i](http://evil.example/q.png) `b",
    "``` ![i](http://evil.example/f.png)",
    ":red[big] :material/warning: $x^2$ **bold** _it_ ~~s~~ | a | b |",
    "# heading\n- item\n1. first",
    "\u202eevil.example\u200b",
)


def test_the_checker_sees_what_markdown_would_make():
    # the checker itself: each hostile value as-is is active markup
    for value in HOSTILE[:8]:
        assert active_markup(value), value
    # the reflected case: a value that closes the code span it was put in
    assert active_markup(f"Run `{HOSTILE[8]}` was not found.")


@pytest.mark.parametrize("value", HOSTILE)
def test_md_text_is_inert_and_reads_as_written(value):
    text = md_text(value)
    assert active_markup(text) == [], text
    assert active_markup(f"**{text}** · {text}") == []
    # a person reads the value itself, newlines and invisible characters as escapes
    # (issue 23: spaces hid that a name held a newline or a right-to-left override)
    expected = value.replace("\n", "\\n").replace("\u202e", "\\u202e").replace("\u200b", "\\u200b")
    assert shown(text) == expected
    assert "\n" not in text


@pytest.mark.parametrize("value", HOSTILE)
def test_md_code_is_inert(value):
    assert active_markup(f"Run {md_code(value)} was not found.") == []


def test_ordinary_ids_and_paths_pass_unchanged():
    for value in ("slow-loader-first", "20261201-002302-healthy-123456", "/data/runs/x.json"):
        assert md_text(value) == value
