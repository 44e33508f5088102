"""What the pages show of one analysis: summary cards, evidence rows, severity badges and
the chart inputs taken from findings (the same choices the reports make)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from diagnostics.facts.mfu import COUNTED_LABEL, MODEL_LABEL
from diagnostics.metrics import (
    ALL_STEPS,
    GPU_BUSY,
    GPU_KERNEL_UTILISATION,
    PROFILED_WINDOW,
    KeyMetrics,
    peak_memory_name,
)
from diagnostics.report import fmt as report_fmt
from diagnostics.report.sections import gpu_identity, kernel_coverage_rows, roofline_rows
from diagnostics.views.fmt import fmt_bytes, fmt_ms, fmt_pct, fmt_rate


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


def evidence_rows(evidence: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The evidence a person reads: (label, formatted value), worded as in the reports
    (``report.fmt.evidence_rows``: one formatter, labels written for people, numbers in
    their units); series longer than a few values are left to the chart."""
    shown = {
        key: value
        for key, value in evidence.items()
        if not (
            isinstance(value, list | tuple) and len(value) > 8 and all(_is_scalar(v) for v in value)
        )
    }
    return [
        (label[:1].upper() + label[1:], value) for label, value in report_fmt.evidence_rows(shown)
    ]


SEVERITY_BADGES: dict[str, str] = {
    "high": ":red-badge[:material/error: high]",
    "medium": ":orange-badge[:material/warning: medium]",
    "low": ":blue-badge[:material/info: low]",
}


def severity_badge(severity: str) -> str:
    return SEVERITY_BADGES.get(severity, f":gray-badge[{severity}]")


@dataclass(frozen=True)
class Card:
    label: str  # short, so that it fits a card at 1280 px; the full name opens the help
    value: str
    help: str


# cards per row, at most: four fit their values at 1280 px with the sidebar open
CARDS_PER_ROW = 4

# a key metric's card label, on a run's cards and on Compare's (the full name is the help)
CARD_LABELS = {
    "median_step_time_ms": "Median step time",
    "data_wait_pct": "Data-wait share",
    "gpu_kernel_utilization_pct": "GPU utilisation",
    "gpu_busy_pct": "GPU busy",
    "peak_memory_bytes": "Peak memory",
    "mfu_pct": "MFU",
    "counted_flops_utilization_pct": "HFU",
}
# what each peak-memory window covers, for the card's help
_WINDOW_NOTES = {
    ALL_STEPS: " (the run's step records, as the Memory chart shows them).",
    PROFILED_WINDOW: " (the trace's memory events: only the steps the profiler recorded).",
}


def card_rows(count: int) -> list[int]:
    """How many cards each row holds: rows of at most CARDS_PER_ROW, as even as they go
    (6 cards: 3 + 3, 7: 4 + 3), so no card is narrower than its value."""
    if count <= 0:
        return []
    rows = -(-count // CARDS_PER_ROW)
    per_row = -(-count // rows)
    sizes = [per_row] * (count // per_row)
    return sizes + ([count % per_row] if count % per_row else [])


def summary_cards(metrics: KeyMetrics) -> list[Card]:
    """The cards at the top of a run or trace, formatted (KeyMetrics is shared with the
    reports and the comparison, so the page and a downloaded report agree)."""
    # the unit goes in the label: a value like "1,234 samples/s" does not fit a card
    if metrics.samples_per_s is not None:
        throughput_label, throughput = "Samples/s", fmt_rate(metrics.samples_per_s, "").strip()
        throughput_help = "Batch size ÷ median step time: the throughput of the median step."
    else:
        throughput_label, throughput = "Steps/s", fmt_rate(metrics.steps_per_s, "").strip()
        throughput_help = "1 ÷ median step time (a trace has no batch size)."
    memory = peak_memory_name(metrics.peak_memory_kind)
    window = metrics.peak_memory_window
    return [
        Card(
            CARD_LABELS["median_step_time_ms"],
            fmt_ms(metrics.median_step_time_ms),
            "Half the steady-state steps (each phase's first step left out) were faster "
            "than this (data wait + copy + compute + optimiser).",
        ),
        Card(throughput_label, throughput, throughput_help),
        Card(
            CARD_LABELS["gpu_kernel_utilization_pct"],
            fmt_pct(metrics.gpu_kernel_utilization_pct),
            f"{GPU_KERNEL_UTILISATION}: share of the profiled steps' span in which at least "
            "one kernel ran (any stream), as nvidia-smi and the TensorBoard plugin define "
            "GPU utilisation; without a trace, NVML's mean over the steps ('—' without a GPU).",
        ),
        Card(
            CARD_LABELS["gpu_busy_pct"],
            fmt_pct(metrics.gpu_busy_pct),
            f"{GPU_BUSY}: share of the profiled steps' span in which any GPU work ran: "
            "kernels, copies or memsets, any stream (HTA's busy time). Needs a trace ('—' "
            "from NVML alone).",
        ),
        Card(
            CARD_LABELS["data_wait_pct"],
            fmt_pct(metrics.data_wait_pct),
            "Median over steady-state steps of each step's wait for its batch ÷ its step time.",
        ),
        Card(
            f"Peak {memory}" if metrics.peak_memory_kind else CARD_LABELS["peak_memory_bytes"],
            fmt_bytes(metrics.peak_memory_bytes),
            f"Highest {memory} over {window}{_WINDOW_NOTES.get(window, '.')}"
            if window
            else "No memory figure in this input.",
        ),
        *_flops_cards(metrics),
    ]


def _flops_cards(metrics: KeyMetrics) -> list[Card]:
    """The two FLOPs utilisations, for a GPU run or trace only (a CPU has no peak to hold
    them against); '—' where the device or the model's config is not known."""
    if metrics.device != "cuda":
        return []
    model_label = metrics.mfu_label or MODEL_LABEL
    return [
        Card(
            CARD_LABELS["mfu_pct"],
            fmt_pct(metrics.mfu_pct),
            f"{model_label[:1].upper() + model_label[1:]}: median over steady-state steps of "
            "the model's FLOPs (6N + 12·L·H·Q·T per token, PaLM appendix B, from the "
            "reference trainer's config, or for a script from the model its HF Trainer "
            "trained, times the step's real tokens) ÷ step time ÷ the GPU's dense peak for "
            "the run's precision. '—': no model sizes recorded, no peak known, or the "
            "precision not known.",
        ),
        Card(
            CARD_LABELS["counted_flops_utilization_pct"],
            fmt_pct(metrics.counted_flops_utilization_pct),
            f"{COUNTED_LABEL[:1].upper() + COUNTED_LABEL[1:]}: median over profiler steps of "
            "the FLOPs the trace's operators did (counted from their recorded shapes, "
            "backward and recomputation included) ÷ step time ÷ the dense peak. '—': no "
            "shapes, no peak known, or too little GPU time in counted operators.",
        ),
    ]


def spike_steps(findings: Iterable[Any]) -> list[int]:
    """Steps an unstable-gradients finding marks, for the loss/grad-norm chart."""
    for finding in findings:
        for key in ("spike_steps", "outlier_steps"):
            values = (finding.evidence or {}).get(key)
            if isinstance(values, list | tuple):
                return [int(v) for v in values if isinstance(v, int | float)]
    return []


def leak_slope(findings: Iterable[Any]) -> tuple[float | None, str]:
    """A leak finding's fitted growth (bytes/step) and the memory column it was fitted on."""
    for finding in findings:
        if "leak" not in finding.rule:
            continue
        for key, value in (finding.evidence or {}).items():
            if key.endswith("bytes_per_step") and isinstance(value, int | float):
                return float(value), "cuda_allocated_bytes" if "cuda" in key else "rss_bytes"
    return None, "rss_bytes"


def operator_time_column(operators: pl.DataFrame) -> str:
    """device_us when the trace has GPU time for its operators, else host_us."""
    if "device_us" in operators.columns and (operators["device_us"].fill_null(0) > 0).any():
        return "device_us"
    return "host_us"


def source_caption(source: Mapping[str, Any], environment: Mapping[str, Any]) -> str:
    """'2 ranks · cuda · NVIDIA A100-SXM4-80GB · PyTorch 2.1' from an analysis' source/env."""
    parts = []
    ranks = source.get("ranks")
    count = len(ranks) if isinstance(ranks, Sequence) and not isinstance(ranks, str) else ranks
    if isinstance(count, int) and count > 1:
        parts.append(f"{count} ranks")
    for key, prefix in (("device", ""), ("gpu_name", ""), ("pytorch_version", "PyTorch ")):
        value = environment.get(key)
        if value:
            parts.append(f"{prefix}{value}")
        if key == "gpu_name" and gpu_identity(environment):
            parts.append(str(gpu_identity(environment)))
    return " · ".join(parts) or "trace"


def roofline_summary_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The roofline rows (label, value) as the reports word them: the device's dense peak,
    the FLOPs counted from the shapes, the largest signatures' rates (docs/ROOFLINE.md)."""
    return [(label[:1].upper() + label[1:], value) for label, value in roofline_rows(summary)]


def coverage_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The kernel-coverage rows (label, value) as the reports word them: kernel time
    classified by unit and precision, attributed to operators, and the unknown kernels."""
    return [
        (label[:1].upper() + label[1:], value) for label, value in kernel_coverage_rows(summary)
    ]
