"""Upload names made safe for the disk, and how many files one upload may hold."""

from __future__ import annotations

import re
from pathlib import Path

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

# One trace per rank, for up to 128 ranks: many rank files are analysed in a process pool
# that keeps only per-rank summaries (diagnostics.rank_pool), so memory does not grow with
# the count.
MAX_UPLOAD_FILES = 128


def safe_upload_name(name: str) -> str:
    """A file name from a browser made safe for the disk: no folders, no odd characters."""
    base = Path(name.replace("\\", "/")).name
    cleaned = _UNSAFE.sub("_", base).strip("._") or "trace.json"
    return cleaned[:120]
