"""Numbers for people: durations, sizes, shares, rates and times, each with its unit."""

from __future__ import annotations

import time

from diagnostics.report import fmt as report_fmt

# One formatter for the pages and the reports, so a number reads the same in both.
_missing = report_fmt._missing
fmt_ms = report_fmt.ms  # '840 µs', '12.3 ms', '1.25 s', '3 min 20 s'
fmt_pct = report_fmt.pct  # '42.3 %'
fmt_ratio = report_fmt.ratio  # '2.41×'
fmt_rate = report_fmt.rate  # '1,234 samples/s', '12.5 steps/s'
fmt_step_time_saving = report_fmt.saving  # '57 % less step time (2.33× faster)'
prediction_line = report_fmt.prediction_line  # a re-run's predicted and measured saving


def fmt_seconds(value_s: float | None) -> str:
    """Elapsed time and ETAs, where tenths past 10 s are noise: '4.2 s', '30 s', '3 min 20 s'."""
    if _missing(value_s):
        return "—"
    value_s = float(value_s)
    if value_s < 60.0:
        return f"{value_s:.1f} s" if value_s < 10 else f"{value_s:.0f} s"
    return report_fmt.seconds(value_s)


def fmt_bytes(value: float | None) -> str:
    """Compact, for cards: three significant figures, '512 B', '1.5 KiB', '23.4 MiB'
    (report tables use report_fmt.bytes_, two decimals, for columns that line up)."""
    if _missing(value):
        return "—"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024.0 or unit == "TiB":
            return f"{value:.0f} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024.0
    raise AssertionError("unreachable")


def fmt_saving(value_pct: float | None) -> str:
    """An estimated saving: whole percent, and 'under 1 %' rather than a misleading '0 %'."""
    if _missing(value_pct):
        return "—"
    # below 1 % a whole percent would round to a misleading "0 %" or "1 %"
    return "under 1 %" if float(value_pct) < 1.0 else f"{float(value_pct):.0f} %"


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
