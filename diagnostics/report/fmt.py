"""Numbers for people, shared by every renderer (plain text; each renderer escapes it)."""

from __future__ import annotations

import json
import math
from typing import Any

MISSING = "—"


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def ms(value_ms: float | None) -> str:
    if _missing(value_ms):
        return MISSING
    value = float(value_ms)
    if abs(value) < 1.0:
        return f"{value * 1000:.0f} µs"
    if abs(value) < 100.0:
        return f"{value:.1f} ms"
    if abs(value) < 1000.0:
        return f"{value:.0f} ms"
    return seconds(value / 1000.0)


def seconds(value_s: float | None) -> str:
    if _missing(value_s):
        return MISSING
    value = float(value_s)
    if abs(value) < 60:
        return f"{value:.2f} s" if abs(value) < 10 else f"{value:.1f} s"
    minutes, secs = divmod(round(value), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def pct(value: float | None, digits: int = 1) -> str:
    return MISSING if _missing(value) else f"{float(value):.{digits}f} %"


def ratio(value: float | None) -> str:
    return MISSING if _missing(value) else f"{float(value):.2f}×"


def speedup_headline(speedup: float | None, a_ms: float | None, b_ms: float | None) -> str | None:
    """A comparison's one line, from the median step times: 'B is 1.34× faster: median step
    133 ms → 99.1 ms'. Within 2 % either way it reads as the same speed (two runs of one
    config differ that much)."""
    if _missing(speedup) or _missing(a_ms) or _missing(b_ms):
        return None
    steps = f"median step {ms(a_ms)} → {ms(b_ms)}"
    if abs(float(speedup) - 1.0) < 0.02:
        return f"B runs at the speed of A: {steps}"
    if speedup > 1.0:
        return f"B is {ratio(speedup)} faster: {steps}"
    return f"B is {ratio(1.0 / float(speedup))} slower: {steps}"


def usd(value: float | None) -> str:
    if _missing(value):
        return MISSING
    value = float(value)
    return f"${value:,.2f}" if abs(value) >= 0.01 or value == 0 else f"${value:.4f}"


def bytes_(value: float | None) -> str:
    if _missing(value):
        return MISSING
    value = float(value)
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if abs(value) >= size:
            return f"{value / size:,.2f} {unit}"
    return f"{value:,.0f} B"


def number(value: Any) -> str:
    if _missing(value):
        return MISSING
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if value == int(value) and abs(value) < 1e15:
            return f"{int(value):,}"
        return f"{value:,.3g}" if abs(value) < 1 else f"{value:,.2f}"
    return str(value)


def unit_value(value: Any, unit: str) -> str:
    """A value in the unit a metric row carries."""
    if unit == "ms":
        return ms(value)
    if unit == "%":
        return pct(value)
    if unit == "bytes":
        return bytes_(value)
    if _missing(value):
        return MISSING
    return f"{number(value)} {unit}".strip()


_UNIT_TOKENS = ("ms", "us", "s", "pct", "bytes", "mib", "gib")


def _unit_of(key: str) -> tuple[str | None, list[str], list[str]]:
    """(unit, words before it, words after it) of a key named with its unit somewhere in
    it: 'data_wait_ms_median' -> ('ms', ['data', 'wait'], ['median'])."""
    tokens = [t for t in key.split("_") if t]
    if len(tokens) >= 2 and tokens[-2:] == ["gb", "s"]:
        return "gb/s", tokens[:-2], []
    if len(tokens) >= 2 and tokens[-2:] == ["per", "s"]:
        return "/s", tokens[:-2], []
    for index, token in enumerate(tokens):
        if index > 0 and token.lower() in _UNIT_TOKENS:
            return token.lower(), tokens[:index], tokens[index + 1 :]
    return None, tokens, []


def evidence_value(key: str, value: Any, max_chars: int = 240) -> str:
    """An evidence value formatted by the unit in its key name, lists and dicts compact."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        unit, _, _ = _unit_of(key)
        if unit == "ms":
            return ms(value)
        if unit == "us":
            return ms(float(value) / 1000.0)
        if unit == "s":
            return seconds(value)
        if unit == "pct":
            return pct(value)
        if unit == "bytes":
            return bytes_(value)
        if unit == "mib":
            return bytes_(float(value) * 1024**2)
        if unit == "gib":
            return bytes_(float(value) * 1024**3)
        if unit == "gb/s":
            return f"{number(value)} GB/s"
        return number(value)
    if isinstance(value, str):
        text = value
    elif value is None or isinstance(value, bool):
        text = number(value) if value is not None else MISSING
    else:
        text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def config_literal(value: Any) -> str:
    """A value as ``--set key=value`` takes it: JSON for bools, null, numbers; strings bare."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


def label(key: str) -> str:
    """An evidence key as a label: the unit word goes (the formatted value carries it),
    the words around it stay ('data_wait_ms_median' -> 'data wait median'); shares keep
    theirs as '(%)' and rates as 'per s'."""
    unit, before, after = _unit_of(key)
    if unit is None:
        return key.replace("_", " ")
    words = " ".join(before + after)
    if unit == "pct":
        return f"{words} (%)"
    if unit == "/s":
        return f"{words} per s"
    return words
