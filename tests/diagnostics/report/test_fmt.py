from __future__ import annotations

import pytest

from diagnostics.chart import Chart
from diagnostics.report import fmt


@pytest.mark.parametrize(
    ("key", "value", "label", "text"),
    [
        ("data_wait_ms", 40.0, "data wait", "40.0 ms"),
        ("data_wait_ms_median", 59.46, "data wait median", "59.5 ms"),
        ("step_us_mean", 177_592.2, "step mean", "178 ms"),  # 177,592 µs = 177.6 ms
        ("gpu_busy_us", 840.0, "GPU busy", "840 µs"),  # under a millisecond stays in µs
        ("data_wait_pct", 33.4, "data wait (%)", "33.4 %"),
        ("pageable_bandwidth_gb_s", 10.1, "pageable bandwidth", "10.10 GB/s"),
        (
            "pageable_htod_bytes_per_step",
            18.5 * 2**20,
            "pageable host-to-device copies per step, size",
            "18.50 MiB",
        ),
        ("slope_mib_per_100_steps", 1.5, "slope per 100 steps", "1.50 MiB"),
        ("samples_per_s", 80.0, "samples per s", "80"),
        ("runtime_s", 200.0, "runtime", "3 min 20 s"),
        ("num_workers", 0, "DataLoader workers now", "0"),
        ("steps", [5, 10], "steps", "5–10"),  # [first, last]: a range
        ("cpu_count", None, "CPU cores", "—"),
        (
            "io_ms_per_batch_from_config",
            64.0,
            "storage latency per batch (from the config)",
            "64.0 ms",
        ),
        ("projected_steps_to_oom", 120, "steps until memory runs out (projected)", "120"),
    ],
)
def test_evidence_keys_carry_their_units(key, value, label, text):
    assert fmt.label(key) == label
    assert fmt.evidence_value(key, value) == text


def test_labels_are_written_once_and_ranges_are_relative():
    rows = dict(
        fmt.evidence_rows(
            {
                "pageable_htod_bytes_per_step": 2**20,
                "pageable_htod_us_per_step": 1500.0,
                # absolute trace timestamps (µs since the epoch): a length, not "1451 h"
                "time_range_us": [5_224_800_000_000.0, 5_224_801_250_000.0],
                "idle_by_host_activity": {"dataloader": {"idle_us": 30_000.0, "share_pct": 85.7}},
                "chart": Chart("line", "Copies", "step", "time (ms)", (1,), {"copy (ms)": (1.5,)}),
            }
        )
    )
    assert rows == {
        "pageable host-to-device copies per step, size": "1.00 MiB",
        "pageable host-to-device copies per step, time": "1.5 ms",
        "time range": "1.25 s long",
        "idle by host activity": "dataloader (idle 30.0 ms, share 85.7 %)",
    }


def test_long_values_are_shortened():
    text = fmt.evidence_value("names", ["x" * 100] * 10, max_chars=50)
    assert len(text) == 50 and text.endswith("…")


@pytest.mark.parametrize(
    ("value", "text"),
    [(True, "true"), (None, "null"), (4, "4"), (1.0, "1.0"), ("bf16", "bf16")],
)
def test_config_literals_as_set_takes_them(value, text):
    assert fmt.config_literal(value) == text


def test_people_numbers():
    assert fmt.bytes_(3 * 2**30) == "3.00 GiB"
    assert fmt.seconds(3 * 3600 + 5 * 60) == "3 h 05 min"
    assert fmt.usd(0.0012) == "$0.0012" and fmt.usd(1234.5) == "$1,234.50"
    assert fmt.ratio(2.5) == "2.50×" and fmt.ratio(None) == fmt.MISSING
    assert fmt.pct(float("nan")) == fmt.MISSING


def test_unit_prices_show_the_digits_they_have():
    # a vCPU-hour at $0.0425 read "$0.04" (6 % off); a whole-cent price keeps two decimals
    assert fmt.unit_price(0.0425) == "$0.0425" and fmt.unit_price(0.0125) == "$0.0125"
    assert fmt.unit_price(5.0) == "$5.00" and fmt.unit_price(3.06) == "$3.06"
    assert fmt.unit_price(0.34) == "$0.34" and fmt.unit_price(1234.5) == "$1,234.50"
    assert fmt.unit_price(0.00001) == "$0.00001" and fmt.unit_price(None) == fmt.MISSING


@pytest.mark.parametrize(
    ("key", "text"),
    [
        ("io_ms_per_batch_measured", "I/O per batch measured"),  # was "Io per batch measured"
        ("cuda_core_gemm_us", "CUDA core GEMM"),  # was "Cuda core gemm"
        ("non_finite_steps", "non-finite steps"),  # was "non finite steps"
        ("tf32_enabled", "TF32 enabled"),
    ],
)
def test_labels_from_keys_read_as_written(key, text):
    assert fmt.label(key) == text


def test_a_findings_steps_read_as_the_range_they_are():
    # every rule's "steps" is [first, last]: "2, 68" read as two steps
    assert fmt.evidence_value("steps", [2, 68]) == "2–68"
    assert fmt.evidence_value("steps", [5, 5]) == "5"
    assert fmt.evidence_value("steps", 12) == "12"  # a count stays a count


@pytest.mark.parametrize(
    ("ranks", "row"),
    [
        ([3], ("rank", "3")),  # one file of rank 3: not "ranks 3", read as three
        ([0], ("rank", "0")),  # nor "ranks 0", read as none
        ([0, 1, 2, 3], ("ranks", "4: 0–3")),
        ([0, 2, 5], ("ranks", "3: 0, 2, 5")),
    ],
)
def test_a_sources_ranks_read_as_which_ranks_and_how_many(ranks, row):
    assert fmt.ranks_row(ranks) == row


def test_a_one_rank_traces_report_names_its_rank(shared_traces_dir, tmp_path):
    from diagnostics.report.cli import main

    trace = shared_traces_dir / "hta_a100_rank3_of_8.json.gz"
    out = tmp_path / "r.md"
    assert main([str(trace), "--format", "md", "-o", str(out)]) == 0
    lines = out.read_text().splitlines()
    assert "| rank | 3 |" in lines
    assert "| ranks | 3 |" not in lines
