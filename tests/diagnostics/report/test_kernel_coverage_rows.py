"""Kernel coverage and GPU identity as the text output, the reports and the app word them.

The summary below is the MI300X Qwen trace's (tracelens_mi300x_qwen1.5-0.5b, figures rounded
from the analysis JSON); the rows are checked for what a reader must see in them."""

from __future__ import annotations

from diagnostics.__main__ import render_text
from diagnostics.metrics import compute_key_metrics
from diagnostics.report.sections import gpu_identity, kernel_coverage_rows, summary_rows
from diagnostics.views import coverage_rows

SUMMARY = {
    "kernel_coverage": {
        "kernel_us": 43062.0,
        "classified_pct": 100.0,
        "by_unit_pct": {
            "matrix": 52.4,
            "vector": 31.9,
            "memory": 15.7,
            "communication": 0.0,
            "unknown": 0.0,
        },
        "by_precision_pct": {"bf16": 67.6, "unknown": 32.3, "fp32": 0.1},
        "unknown_kernels": [],
        "unknown_kernel_count": 0,
        "operator_attributed_pct": 69.1,
    }
}
MI300X_ENV = {
    "device": "cuda",
    "gpu_name": "AMD Instinct MI300X VF",
    "gpu_vendor": "amd",
    "gpu_architecture": "gfx942",
    "gpu_generation": "CDNA 3",
    "gpu_model": "MI300X",
    "gpu_compute_capability": None,
}


def test_coverage_rows_name_units_precisions_and_attribution():
    rows = dict(kernel_coverage_rows(SUMMARY))
    assert rows["kernel time by unit"] == "matrix 52.4 %, vector 31.9 %, memory 15.7 %"
    assert rows["kernel time by precision"] == "bf16 67.6 %, unknown 32.3 %, fp32 0.1 %"
    assert rows["kernel time attributed to a CPU operator"] == "69.1 %"
    assert "kernels the table does not know" not in rows


def test_unknown_kernels_are_listed_with_their_time():
    summary = {
        "kernel_coverage": {
            **SUMMARY["kernel_coverage"],
            "classified_pct": 60.0,
            "operator_attributed_pct": None,
            "unknown_kernels": [{"name": "triton__0d1d2d3d", "calls": 4, "device_us": 2500.0}],
            "unknown_kernel_count": 1,
        }
    }
    rows = dict(kernel_coverage_rows(summary))
    assert rows["kernels the table does not know"] == "triton__0d1d2d3d (2.5 ms)"
    assert rows["kernel time attributed to a CPU operator"].startswith("unknown")


def test_no_kernels_no_rows():
    assert kernel_coverage_rows({"kernel_coverage": None}) == []


def test_reports_app_and_text_carry_the_same_rows():
    metrics = compute_key_metrics(None, None)
    report_rows = summary_rows(metrics, SUMMARY)
    assert ("kernel time classified by name", "100.0 %") in report_rows
    assert ("Kernel time classified by name", "100.0 %") in coverage_rows(SUMMARY)
    doc = {
        "source": {"kind": "trace", "path": "qwen.json.gz", "ranks": [0]},
        "environment": MI300X_ENV,
        "summary": SUMMARY,
        "findings": [],
    }
    text = render_text(doc)
    assert "AMD MI300X (gfx942, CDNA 3)" in text.splitlines()[0]
    assert "kernel time by unit: matrix 52.4 %" in text
    assert "Tensor" not in text


def test_gpu_identity_words():
    assert gpu_identity(MI300X_ENV) == "AMD MI300X (gfx942, CDNA 3)"
    assert (
        gpu_identity(
            {
                "gpu_vendor": "nvidia",
                "gpu_model": "B200",
                "gpu_architecture": "sm_100",
                "gpu_generation": "Blackwell",
            }
        )
        == "NVIDIA B200 (sm_100, Blackwell)"
    )
    assert gpu_identity({}) is None
