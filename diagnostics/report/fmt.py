"""Numbers for people, shared by every renderer (plain text; each renderer escapes it)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from diagnostics import percent

MISSING = percent.MISSING


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
    return percent.pct(value, digits)


def ratio(value: float | None) -> str:
    return MISSING if _missing(value) else f"{float(value):.2f}×"


def rate(value: float | None, unit: str) -> str:
    """A rate such as samples/s, the same on a card and in a report: '1,234 samples/s',
    '12.5 steps/s' (three significant figures below 100)."""
    if _missing(value):
        return MISSING
    value = float(value)
    text = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    return f"{text} {unit}".strip()


def saving(value_pct: float | None) -> str:
    """A saving of step time as both readings of it: '57 % less step time (2.33× faster)'.
    A saving of s % is a speed-up of 1 / (1 - s/100): 57 % less time is 2.33×, not 1.57×."""
    if _missing(value_pct):
        return MISSING
    value = float(value_pct)
    if value < 0:
        return f"{-value:.0f} % more step time ({ratio(1.0 / (1.0 - value / 100.0))} as fast)"
    if value < 1.0:  # a whole percent would round to a misleading "0 %"
        return "under 1 % less step time"
    if value >= 100.0:
        return f"{value:.0f} % less step time"
    return f"{value:.0f} % less step time ({ratio(1.0 / (1.0 - value / 100.0))} faster)"


def prediction_line(prediction: Any) -> str | None:
    """A re-run's check of its finding: 'too-few-workers predicted 56 % less step time
    (2.27× faster); the re-run measured 27 % less step time (1.37× faster), 0.48 of the
    prediction.' (``diagnostics.compare.Prediction``); None without one."""
    if prediction is None:
        return None
    line = f"{prediction.rule} predicted {saving(prediction.predicted_saving_pct)}"
    if prediction.measured_saving_pct is None:
        return line + "; the re-run's step time is not known."
    line += f"; the re-run measured {saving(prediction.measured_saving_pct)}"
    calibration = prediction.measured_over_predicted
    return line + (f", {calibration:.2f} of the prediction." if calibration is not None else ".")


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


def unit_price(value: float | None) -> str:
    """A price per hour of one GPU or vCPU, to the digits it has: $3.06, $0.0425 (a vCPU-hour
    shown as "$0.04" would misstate it by 6 %), at most four decimals."""
    if _missing(value):
        return MISSING
    if 0 < abs(float(value)) < 0.0001:
        return "$" + f"{float(value):.10f}".rstrip("0")
    text = f"{float(value):,.4f}".rstrip("0")
    decimals = len(text.partition(".")[2])
    return f"${float(value):,.{max(2, decimals)}f}"


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


def _scalar_value(key: str, value: Any) -> str:
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
    if unit == "/s":
        return rate(value, "")
    return number(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _nested(key: str, value: Any) -> str:
    """A dict or a list of dicts in evidence, each number in its unit: 'dataloader: idle
    30.0 ms, gaps 2, share 85.7 %' (never raw µs or bytes)."""
    if isinstance(value, dict):
        parts = []
        for inner, item in value.items():
            text = (
                f"({_nested(str(inner), item)})"
                if isinstance(item, dict | list | tuple)
                else evidence_value(str(inner), item)
            )
            parts.append(f"{label(str(inner)).removesuffix(' (%)')} {text}")
        return ", ".join(parts)
    items = list(value)
    if all(_is_number(v) or v is None for v in items):
        texts = [MISSING if v is None else _scalar_value(key, v) for v in items]
        if key == "steps" and len(items) == 2 and all(isinstance(v, int) for v in items):
            # every rule's "steps" is [first, last] (rules.evidence.step_range): a range
            return str(items[0]) if items[0] == items[1] else f"{items[0]}–{items[1]}"
        if "range" in key and len(items) == 2 and all(_is_number(v) for v in items):
            # a range as relative times: its length, never absolute timestamps as durations
            start, end = float(items[0]), float(items[1])
            return f"{_scalar_value(key, end - start)} long" if start else " – ".join(texts)
        return ", ".join(texts)
    return "; ".join(
        _nested(key, v) if isinstance(v, dict | list | tuple) else evidence_value(key, v)
        for v in items
    )


def ranks_row(ranks: Any) -> tuple[str, str]:
    """The ranks a source holds as read: ('rank', '3') for one file of rank 3 (not 'ranks 3',
    read as three), ('ranks', '8: 0–7') for several, a run of consecutive ids as a range."""
    ids = list(ranks) if isinstance(ranks, list | tuple) else [ranks]
    if len(ids) == 1:
        return "rank", evidence_value("", ids[0])
    if all(isinstance(i, int) for i in ids) and sorted(ids) == list(
        range(min(ids), min(ids) + len(ids))
    ):
        return "ranks", f"{len(ids)}: {min(ids)}–{max(ids)}"
    return "ranks", f"{len(ids)}: {evidence_value('', ids)}"


def evidence_value(key: str, value: Any, max_chars: int = 240) -> str:
    """An evidence value formatted by the unit in its key name; lists and dicts compact,
    their numbers in units too."""
    if _is_number(value):
        return _scalar_value(key, value)
    if isinstance(value, str):
        text = value
    elif value is None or isinstance(value, bool):
        text = number(value) if value is not None else MISSING
    elif isinstance(value, dict | list | tuple):
        text = _nested(key, value)
    else:
        text = json.dumps(value, default=str, ensure_ascii=False)
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def evidence_rows(evidence: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows of a finding's evidence as people read them, the same on the page
    and in the reports: chart data left out, each label once (a second key that reads the
    same gets its unit named)."""
    rows: list[tuple[str, str]] = []
    seen: set[str] = set()
    for key, value in evidence.items():
        if key == "chart":
            continue
        text = label(str(key))
        if text in seen:
            unit, _, _ = _unit_of(str(key))
            text = f"{text} ({_UNIT_WORDS.get(unit or '', unit or str(key))})"
        seen.add(text)
        rows.append((text, evidence_value(str(key), value)))
    return rows


def config_literal(value: Any) -> str:
    """A value as ``--set key=value`` takes it: JSON for bools, null, numbers; strings bare."""
    if isinstance(value, str):
        return value
    return json.dumps(value)


# evidence keys whose label, derived from the key, would not read well
EVIDENCE_LABELS: dict[str, str] = {
    "io_ms_per_batch_from_config": "storage latency per batch (from the config)",
    "load_ms_per_batch_estimate": "time to load one batch (estimate)",
    "projected_steps_to_oom": "steps until memory runs out (projected)",
    "pageable_htod_bytes": "pageable host-to-device copies, size",
    "pageable_htod_bytes_per_step": "pageable host-to-device copies per step, size",
    "pageable_htod_us_per_step": "pageable host-to-device copies per step, time",
    "pageable_htod_copies": "pageable host-to-device copies",
    "data_wait_share_pct": "data-wait share (%)",
    "compute_ms_median": "rest of the step (median)",
    "step_time_ms_median": "median step time",
    "step_time_ms_mean": "mean step time",
    "throughput_samples_per_s": "throughput (samples/s)",
    "num_workers": "DataLoader workers now",
    "recommended_num_workers": "DataLoader workers recommended",
    "worker_cap": "most workers the cores allow",
    "cpu_count": "CPU cores",
    # a rule's or rank's figure from the trace's busy time (rank_stragglers, ranks table)
    "gpu_utilization_pct": "GPU busy (kernels, copies, memsets) (%)",
    "gpu_busy_pct": "GPU busy (kernels, copies, memsets) (%)",
    "gpu_kernel_utilization_pct": "GPU utilisation (kernel time, as nvidia-smi) (%)",
    "gpu_span_us": "profiled span",
    "excess_pct_of_step_time": "time lost beyond the median step (% of step time)",
    "slow_step_ms_median": "slow steps (median)",
    "slow_step_count": "slow steps",
    "slow_steps": "slow steps at",
    "episodes": "separate episodes",
    "growth_of_each_part": "growth of each part of the step",
    "excluded_steps": "steps left out (known causes)",
    "time_range_s": "time range (since the first sample)",
    "related_rules": "related checks",
    "explained_by_findings": "explained by findings",
}
_WORDS = {
    "gpu": "GPU",
    "cpu": "CPU",
    "io": "I/O",
    "cuda": "CUDA",
    "gemm": "GEMM",
    "gemms": "GEMMs",
    "nccl": "NCCL",
    "mfu": "MFU",
    "tf32": "TF32",
    "bf16": "bf16",
    "non": "non-",
    "htod": "host-to-device",
    "dtoh": "device-to-host",
    "h2d": "host-to-device copy",
    "util": "utilisation",
    "utilization": "utilisation",
    "oom": "out of memory",
    "src": "source",
    "dst": "destination",
    "num": "number of",
    "amp": "AMP",
    "lr": "learning rate",
    "rss": "RSS",
    "nvml": "NVML",
    "fp16": "fp16",
}
_UNIT_WORDS = {"ms": "time", "us": "time", "s": "time", "bytes": "size", "pct": "%"}


def label(key: str) -> str:
    """An evidence key as a label for people: a written one for keys that need it, else the
    key's words with the unit word gone (the formatted value carries it), acronyms in
    capitals ('data_wait_ms_median' -> 'data wait median', 'gpu_idle_us' -> 'GPU idle');
    shares keep theirs as '(%)' and rates as 'per s'."""
    if key in EVIDENCE_LABELS:
        return EVIDENCE_LABELS[key]
    unit, before, after = _unit_of(key)
    words = " ".join(_WORDS.get(w.lower(), w) for w in before + after).replace("non- ", "non-")
    if unit is None:
        return words
    if unit == "pct":
        return f"{words} (%)"
    if unit == "/s":
        return f"{words} per s"
    return words
