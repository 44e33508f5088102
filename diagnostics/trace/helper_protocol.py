"""What the loading process and its decode helper say to each other through their pipes:
fixed-size headers (the chunks' text and columns go through memory files). Standard library
only: both sides import it, the loading one before it imports polars."""

from __future__ import annotations

import os
import struct

# Chunks the helper may hold at once: one it decodes, one waiting, so it never idles.
SLOTS = 2
# parent -> helper: seq, slot, text bytes, flags (below), the ts base
REQUEST = struct.Struct("<QQQQq")
# a ts base is set (else the file has none); decline a chunk with any malformed event
# (the first chunk, whose clock the loading process decided from its timestamps alone);
# hand back the chunk normalised (diagnostics.trace.normalise), and then without its flows
HAS_BASE, STRICT, NORMALISE, WITHOUT_FLOWS = 1, 2, 4, 8
# helper -> parent: seq, slot, status, payload bytes
REPLY = struct.Struct("<QQQQ")
DECODED, DECLINED = 1, 2
READY = b"R"  # the helper's first byte: its imports are done


def read_exactly(fd: int, n: int) -> bytes | None:
    """``n`` bytes from ``fd``; None when it ends first (the other side is gone)."""
    parts = []
    while n:
        part = os.read(fd, n)
        if not part:
            return None
        parts.append(part)
        n -= len(part)
    return b"".join(parts)
