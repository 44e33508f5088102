"""What markdown makes of a string: links, images, raw HTML and GFM autolinks found in it.

markdown-it-py parses CommonMark (as Streamlit's react-markdown does) with GFM tables and
strikethrough; GFM's bare-URL autolinks ("http://x", "www.x", "a@b.c") are found on the
source outside code spans, where an escape (``http\\://``) stops them as it does in GFM.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from markdown_it import MarkdownIt

_PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])
_ACTIVE = {"link_open", "image", "html_inline", "html_block"}
_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_AUTOLINK_LITERAL = re.compile(
    r"(?i)(?<![\\\w])(?:https?://|ftp://|mailto:|xmpp:|www\.)|[\w.+-](?<!\\)@[\w-]+\.\w"
)


def _tokens(tokens: Iterable) -> Iterable:
    for token in tokens:
        yield token
        yield from _tokens(token.children or ())


def active_markup(text: str) -> list[str]:
    """Every link, image, HTML or autolink markdown would make of ``text`` (empty = inert)."""
    found = [
        f"{token.type}: {token.attrs or token.content}"
        for token in _tokens(_PARSER.parse(text))
        if token.type in _ACTIVE
    ]
    outside_code = _CODE_SPAN.sub("", text)
    found += [f"autolink: {m.group(0)}" for m in _AUTOLINK_LITERAL.finditer(outside_code)]
    return found
