"""The one way a share is written for people: ``12.3 %``.

It lives below both the rules (finding titles and recommendations) and the report and page
formatters (evidence rows, cards), so a title's "95.8 %" is the evidence's "95.8 %", never
"96%" beside it.
"""

from __future__ import annotations

import math

MISSING = "—"


# Below this a share is written as a bound: its digits would say more than any input here
# measures (a 0.0004 % share of a step is a fraction of a microsecond).
SMALLEST_WRITTEN = 0.001


def pct(value: float | None, digits: int = 1) -> str:
    """``12.3 %``; a missing or non-finite value as a dash.

    A share that is not zero but would print as ``0.0 %`` keeps two significant figures
    (``0.041 %``: the default-size model's MFU on an H200 read "0.0 %", as if nothing of
    the device were used), and under :data:`SMALLEST_WRITTEN` is written ``< 0.001 %``.
    """
    if value is None or not math.isfinite(float(value)):
        return MISSING
    share = float(value)
    if share == 0 or abs(share) >= 0.5 * 10**-digits:
        return f"{share:.{digits}f} %"
    if abs(share) < SMALLEST_WRITTEN:
        return f"< {SMALLEST_WRITTEN} %" if share > 0 else f"> -{SMALLEST_WRITTEN} %"
    significant = 1 - math.floor(math.log10(abs(share)))
    return f"{share:.{significant}f} %"
