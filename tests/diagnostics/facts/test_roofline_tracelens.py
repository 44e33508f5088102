"""The FLOP model and roofline against TraceLens's published GEMM.csv for the shared H100 and
MI300X Qwen1.5-0.5B traces (../shared/traces/reference/, from TraceLens's regression tests).

Expected values are TraceLens's own figures read from its CSV, never from this project's
tables: GFLOP per GEMM signature (name, M, N, K, bias, dtype) equal to 1e-9 relative, TFLOP/s
(median over calls, TraceLens's ``TFLOPS/s_median``) within 1 %, Data Moved (MB) equal. Each
trace is loaded and analysed once per module (about 1 s each).
"""

from __future__ import annotations

import csv
import json

import polars as pl
import pytest

from diagnostics.analyze import analyze
from diagnostics.facts.assemble import compute_facts

from .trace_fixture import SHARED_TRACES, load_events

TRACES = {
    "h100": "tracelens_h100_qwen1.5-0.5b_infer_profmem.json.gz",
    "mi300x": "tracelens_mi300x_qwen1.5-0.5b_infer_profmem.json.gz",
}
DTYPES = {"('c10::BFloat16', 'c10::BFloat16')": "c10::BFloat16", "('float', 'float')": "float"}


def _reference(device: str) -> list[dict[str, str]]:
    path = SHARED_TRACES / "reference" / f"tracelens_{device}_qwen1.5-0.5b" / "GEMM.csv"
    with path.open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.fixture(scope="module", params=sorted(TRACES))
def case(request):
    events, metadata = load_events(SHARED_TRACES / TRACES[request.param])
    return request.param, compute_facts(events, metadata).roofline


def _shape(row: dict[str, str]) -> str:
    batch = int(row["param: B"])
    head = f"B={batch} " if batch != 1 else ""
    tail = " bias" if row["param: bias"] == "True" else ""
    return f"{head}M={row['param: M']} N={row['param: N']} K={row['param: K']}{tail}"


def test_every_tracelens_gemm_signature_has_its_gflops_bytes_and_rate(case):
    device, roofline = case
    ours = roofline.signatures
    reference = _reference(device)
    assert len(reference) == 5
    for row in reference:
        match = ours.filter(
            (pl.col("name") == row["name"])
            & (pl.col("shape") == _shape(row))
            & (pl.col("dtype") == DTYPES[row["param: dtype_A_B"]])
        )
        assert match.height == 1, (device, row["name"], _shape(row))
        got = match.row(0, named=True)
        assert got["calls"] == int(row["name_count"])
        assert got["gflops"] == pytest.approx(float(row["GFLOPS_first"]), rel=1e-9)
        assert got["mbytes"] == pytest.approx(float(row["Data Moved (MB)_first"]), rel=1e-9)
        assert got["flops_per_byte"] == pytest.approx(float(row["FLOPS/Byte_first"]), rel=1e-9)
        assert got["tflops_per_s_median"] == pytest.approx(float(row["TFLOPS/s_median"]), rel=0.01)
        # all calls' FLOPs over all their GPU time: TraceLens's mean of per-call rates, 1 %
        assert got["tflops_per_s"] == pytest.approx(float(row["TFLOPS/s_mean"]), rel=0.01)
        assert got["gpu_us"] == pytest.approx(float(row["Kernel Time (µs)_sum"]), rel=0.01)


def test_the_devices_peak_is_known_and_the_big_gemms_are_compute_bound(case):
    device, roofline = case
    assert roofline.peak is not None
    # vendor dense bf16 peaks: H100 SXM 989.5 TFLOP/s (datasheet 1979 with sparsity),
    # MI300X 1307.4 (AMD's product page)
    assert roofline.peak.bf16_tflops == {"h100": 989.5, "mi300x": 1307.4}[device]
    big = roofline.signatures.filter(pl.col("shape") == "M=8944 N=2816 K=1024").row(0, named=True)
    # 51.58 GFLOP over 71.0 MiB = 692.8 FLOP/byte, above either ridge (989.5/3.35 = 295,
    # 1307.4/5.3 = 247): compute-bound; TraceLens's median rate over the peak
    assert big["bound"] == "compute"
    expected_pct = {"h100": 610.696 / 989.5, "mi300x": 467.001 / 1307.4}[device] * 100
    assert big["pct_of_peak_flops"] == pytest.approx(expected_pct, rel=0.01)


def test_the_result_json_carries_the_roofline_with_the_peaks_source():
    # the CLI's path (analyze -> summary): the JSON is strict (no NaN) and names its source
    summary = analyze(SHARED_TRACES / TRACES["h100"]).summary["roofline"]
    json.dumps(summary, allow_nan=False)
    assert summary["device_peak"]["device"] == "H100 SXM"
    assert summary["device_peak"]["source"].startswith("https://")
    top = summary["signatures"][0]  # the largest by GPU time: TraceLens's first GEMM row
    assert (top["name"], top["shape"]) == ("aten::mm", "M=8944 N=2816 K=1024")
    assert top["tflops_per_s_median"] == pytest.approx(610.6963594828014, rel=0.01)
