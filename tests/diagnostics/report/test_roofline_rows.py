"""The report's roofline rows from a hand-written summary.roofline (the JSON's shape, figures
from TraceLens's H100 Qwen GEMM: 610.5 TFLOP/s over the H100 SXM's 989.5 = 61.7 %)."""

from __future__ import annotations

from diagnostics.report.sections import roofline_rows

PEAK = {"device": "H100 SXM", "bf16_tflops": 989.5, "hbm_tbps": 3.35, "source": "datasheet"}
SIGNATURE = {
    "name": "aten::mm",
    "shape": "M=8944 N=2816 K=1024",
    "tflops_per_s": 610.5,
    "pct_of_peak_flops": 61.7,
    "bound": "compute",
}


def test_rows_name_the_peak_its_source_and_the_largest_signatures_rate():
    summary = {
        "roofline": {
            "device_peak": PEAK,
            "counted_gflops": 5765.9,
            "counted_gpu_us": 24700.0,
            "signatures": [SIGNATURE],
        }
    }
    rows = dict(roofline_rows(summary))
    assert "H100 SXM" in rows["device peak (dense)"] and "datasheet" in rows["device peak (dense)"]
    assert rows["roofline: aten::mm M=8944 N=2816 K=1024"] == (
        "610.5 TFLOP/s, 61.7 % of peak, compute-bound"
    )


def test_an_unknown_device_says_so_and_gives_no_percentage():
    unknown = {**SIGNATURE, "pct_of_peak_flops": None, "bound": None}
    summary = {"roofline": {"device_peak": None, "counted_gflops": 1.0, "signatures": [unknown]}}
    rows = dict(roofline_rows(summary))
    assert rows["device peak (dense)"].startswith("unknown device")
    assert rows["roofline: aten::mm M=8944 N=2816 K=1024"] == "610.5 TFLOP/s"
    assert roofline_rows({"roofline": None}) == []
