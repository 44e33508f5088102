"""What markdown makes of a string: links, images, raw HTML and GFM autolinks found in it.

markdown-it-py parses CommonMark (as Streamlit's react-markdown does) with GFM tables and
strikethrough. GFM's bare-URL and e-mail autolinks are found as Streamlit's renderer finds
them: on the text after escapes are resolved (mdast-util-gfm-autolink-literal's patterns),
outside code spans, so an escaped ``http\\://`` still counts, as it does in the browser.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from markdown_it import MarkdownIt

_PARSER = MarkdownIt("commonmark").enable(["table", "strikethrough"])
_ACTIVE = {"link_open", "image", "html_inline", "html_block"}
_URL_LITERAL = re.compile(r"(?i)(?:https?://|www(?=\.))[-.\w]+")
_EMAIL_LITERAL = re.compile(r"[-.\w+]+@[-\w]+(?:\.[-\w]+)+")


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
    for token in _tokens(_PARSER.parse(text)):
        if token.type == "inline":
            # text as rendered (escapes resolved); code spans and tags split it apart
            words = " ".join(t.content for t in token.children or () if t.type == "text")
            found += [f"autolink: {m.group(0)}" for m in _URL_LITERAL.finditer(words)]
            found += [f"autolink: {m.group(0)}" for m in _EMAIL_LITERAL.finditer(words)]
    return found
