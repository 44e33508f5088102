"""Text from an input made safe to show: one line, nothing a terminal would act on.

File names, GPU names and PyTorch versions come from the user's files. A newline in one
would split an error line in two; ESC starts a terminal control sequence (colours, a
cleared screen, a retitled window); U+202E reverses the text that follows it, so a name
can read as something else. :func:`printable` writes every such character as a Python
escape (``\\n``, ``\\x1b``, ``\\u202e``) and leaves all other text, non-ASCII letters
included, as it is. Applying it twice gives the same text.
"""

from __future__ import annotations

import unicodedata

# Unicode categories a reader cannot see or a terminal acts on: controls (C0, DEL, C1),
# format characters (bidirectional overrides, zero-width joiners), line and paragraph
# separators, surrogates (a non-UTF-8 byte of a file name, as os.fsdecode keeps it), and
# unassigned code points
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Cn"})
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the file name's own byte
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(value: object) -> str:
    """``str(value)`` with control, format and separator characters written as escapes."""
    text = str(value)
    if text.isprintable():
        # False for every character escaped below (and for spaces other than U+0020,
        # which stay as they are): the common case costs one scan
        return text
    return "".join(
        _escape(char) if unicodedata.category(char) in _HIDDEN_CATEGORIES else char for char in text
    )
