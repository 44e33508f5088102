"""The one way a share is written for people: ``12.3 %``.

It lives below both the rules (finding titles and recommendations) and the report and page
formatters (evidence rows, cards), so a title's "95.8 %" is the evidence's "95.8 %", never
"96%" beside it.
"""

from __future__ import annotations

import math

MISSING = "—"


def pct(value: float | None, digits: int = 1) -> str:
    """``12.3 %``; a missing or non-finite value as a dash."""
    if value is None or not math.isfinite(float(value)):
        return MISSING
    return f"{float(value):.{digits}f} %"
