"""Numbers for people: durations, sizes, shares, rates and times, each with its unit."""

from __future__ import annotations

import math
import time
from typing import Any


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def fmt_ms(value_ms: float | None) -> str:
    """A duration given in milliseconds: '840 µs', '12.3 ms', '1.25 s', '3 min 20 s'."""
    if _missing(value_ms):
        return "—"
    value_ms = float(value_ms)
    if abs(value_ms) < 1.0:
        return f"{value_ms * 1000:.0f} µs"
    if abs(value_ms) < 100.0:
        return f"{value_ms:.1f} ms"
    if abs(value_ms) < 1000.0:
        return f"{value_ms:.0f} ms"
    return fmt_seconds(value_ms / 1000.0)


def fmt_seconds(value_s: float | None) -> str:
    """A duration in seconds: '4.2 s', '3 min 20 s', '1 h 05 min'."""
    if _missing(value_s):
        return "—"
    value_s = float(value_s)
    if value_s < 60.0:
        return f"{value_s:.1f} s" if value_s < 10 else f"{value_s:.0f} s"
    minutes, seconds = divmod(int(round(value_s)), 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def fmt_bytes(value: float | None) -> str:
    """Binary units, three significant figures: '512 B', '1.50 KiB', '23.4 MiB', '1.02 GiB'."""
    if _missing(value):
        return "—"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024.0 or unit == "TiB":
            return f"{value:.0f} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024.0
    raise AssertionError("unreachable")


def fmt_pct(value_pct: float | None, digits: int = 1) -> str:
    if _missing(value_pct):
        return "—"
    return f"{float(value_pct):.{digits}f} %"


def fmt_saving(value_pct: float | None) -> str:
    """An estimated saving: whole percent, and 'under 1 %' rather than a misleading '0 %'."""
    if _missing(value_pct):
        return "—"
    return "under 1 %" if float(value_pct) < 0.5 else f"{float(value_pct):.0f} %"


def fmt_number(value: float | None) -> str:
    """A plain quantity: thousands separated, at most three significant decimals."""
    if _missing(value):
        return "—"
    value = float(value)
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


def fmt_rate(value: float | None, unit: str) -> str:
    """A rate such as samples/s: '1,234 samples/s', '12.5 steps/s'."""
    if _missing(value):
        return "—"
    value = float(value)
    text = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    return f"{text} {unit}"


def fmt_ratio(value: float | None) -> str:
    """A ratio as a multiplier: '2.41×'."""
    if _missing(value):
        return "—"
    return f"{float(value):.2f}×"


def fmt_when(timestamp: float | None, now: float | None = None) -> str:
    """Unix seconds as 'just now', '5 min ago', '3 h ago', else the UTC date and time."""
    if _missing(timestamp) or not timestamp:
        return "—"
    now = time.time() if now is None else now
    age_s = now - float(timestamp)
    if 0 <= age_s < 45:
        return "just now"
    if 0 <= age_s < 3600:
        return f"{max(1, round(age_s / 60))} min ago"
    if 0 <= age_s < 24 * 3600:
        return f"{round(age_s / 3600)} h ago"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(timestamp)))
