from __future__ import annotations

import pytest

from diagnostics.report import fmt


@pytest.mark.parametrize(
    ("key", "value", "label", "text"),
    [
        ("data_wait_ms", 40.0, "data wait", "40.0 ms"),
        ("data_wait_ms_median", 59.46, "data wait median", "59.5 ms"),
        ("step_us_mean", 177_592.2, "step mean", "178 ms"),  # 177,592 µs = 177.6 ms
        ("gpu_busy_us", 840.0, "gpu busy", "840 µs"),  # under a millisecond stays in µs
        ("data_wait_pct", 33.4, "data wait (%)", "33.4 %"),
        ("pageable_bandwidth_gb_s", 10.1, "pageable bandwidth", "10.10 GB/s"),
        ("pageable_htod_bytes_per_step", 18.5 * 2**20, "pageable htod per step", "18.50 MiB"),
        ("slope_mib_per_100_steps", 1.5, "slope per 100 steps", "1.50 MiB"),
        ("samples_per_s", 80.0, "samples per s", "80"),
        ("runtime_s", 200.0, "runtime", "3 min 20 s"),
        ("num_workers", 0, "num workers", "0"),
        ("steps", [5, 10], "steps", "[5, 10]"),
        ("cpu_count", None, "cpu count", "—"),
    ],
)
def test_evidence_keys_carry_their_units(key, value, label, text):
    assert fmt.label(key) == label
    assert fmt.evidence_value(key, value) == text


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
