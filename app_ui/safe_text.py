"""Values from files, folder names, run records, uploads and URLs, made inert for markdown.

Streamlit renders GitHub-flavoured markdown (plus its own ``:color[...]`` directives,
``:material/...:`` icons and ``$...$`` LaTeX) in st.markdown, st.error/warning/info/success,
st.caption, st.subheader, st.table cells, metric, expander, button and page-link labels.
A run id such as ``[log in](http://evil)`` or a file name holding ``![x](http://evil/x.png)``
would become a phishing link or make every visitor's browser fetch an external image.

Every such value goes through ``md_text`` (inline, shown exactly as written) or ``md_code``
(inside a code span) before it meets a markdown string. Characters that cannot start
markup mid-line (letters, digits, ``-``, ``.``, ``/``, ``,``, parentheses…) pass through
unchanged, so ordinary run ids and paths read the same in the page source as on screen.
Imports no streamlit: it is plain string work, tested without a browser.
"""

from __future__ import annotations

import re

from diagnostics.printable import printable

# Everything that opens markup mid-line: emphasis and code (* _ `), links and images ([ ]),
# raw HTML and autolinks (< >), headings and quotes (# >), Streamlit directives, icons and
# URL schemes (:), strikethrough (~), tables (|), LaTeX ($), entities (&), e-mail autolinks
# (@), directive attributes ({ }) and the escape character itself. CommonMark lets any ASCII
# punctuation be backslash-escaped, and an escaped character renders as itself.
_MARKUP = re.compile(r"([\\`*_\[\]<>#:~|$&@{}])")
# GFM also turns bare URLs and e-mail addresses into links, and Streamlit's renderer does so
# on the text after escapes are resolved (mdast-util-gfm-autolink-literal), so escaping
# cannot stop it: an invisible WORD JOINER breaks "http://", "www." and "a@b" instead.
_JOINER = "\u2060"
_BARE_LINK = re.compile(
    r"(?i)(?<=https)(?=://)|(?<=http)(?=://)|(?<=ftp)(?=://)|(?<=www)(?=\.)|(?=@)"
)
# At the start of the text, followed by a space, these open a list or an ordered list.
_BLOCK_START = re.compile(r"^(\s*)(\d{0,9})([-+.)])(?=\s|$)")


def _one_line(text: str) -> str:
    """Control and format characters (newlines, bidi overrides, zero-width) become visible
    escapes (``\\n``, ``\\u202e``: diagnostics.printable, as on the CLI): a value stays on
    its line, cannot start a new markdown block or hide its text, and reads as what it holds.
    The backslashes are then escaped for markdown like any other."""
    return printable(text)


def md_text(value: object) -> str:
    """A value shown as exactly its own text inside Streamlit markdown."""
    text = _one_line("" if value is None else str(value))
    text = _BARE_LINK.sub(_JOINER, text)
    text = _MARKUP.sub(r"\\\1", text)
    return _BLOCK_START.sub(lambda m: f"{m.group(1)}{m.group(2)}\\{m.group(3)}", text)


def md_code(value: object) -> str:
    """A value as an inline code span: nothing inside a code span is markdown, so only the
    fence needs choosing (longer than any run of backticks in the value)."""
    text = _one_line("" if value is None else str(value))
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return f"{fence}{pad}{text}{pad}{fence}"


_ESCAPED = re.compile(r"\\([!-/:-@\[-`{-~])")


def shown(markdown: str) -> str:
    """What a person reads for a string built with md_text (escapes and joiners removed);
    for tests and logs that compare a page's text with the value it came from."""
    return _ESCAPED.sub(r"\1", markdown).replace(_JOINER, "")
