"""with_kernel_classes finds each name's family once and reads every other class off it; it
must give exactly what the one-off expressions (FAMILY, UNIT, PRECISION, ...) give, each of
which repeats the family's regex chain, on every kernel name of the real traces."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_series_equal

from diagnostics.facts import kernel_classes as kc
from diagnostics.facts.kernel_families import FAMILIES
from diagnostics.trace.loader import load

SHARED = Path(__file__).resolve().parents[4] / "shared"
EXPRESSIONS = {
    "family": kc.FAMILY,
    "vendor": kc.VENDOR,
    "unit": kc.UNIT,
    "tensor_core": kc.TENSOR_CORE,
    "cuda_core_gemm": kc.CUDA_CORE_GEMM,
    "matmul": kc.MATMUL,
    "precision": kc.PRECISION,
}


@pytest.fixture(scope="module")
def real_names() -> pl.DataFrame:
    files = sorted((SHARED / "traces").glob("*.json.gz"))
    files += sorted((SHARED / "gpu-runs").glob("*/*/trace/*.pt.trace.json.gz"))
    names: set[str] = {family.example for family in FAMILIES}
    for path in files:
        events = load(path).traces[0].events
        names.update(events.filter(pl.col("cat") == "kernel")["name"].drop_nulls().to_list())
    return pl.DataFrame({"name": [*sorted(names), None]}, schema={"name": pl.String})


def test_the_columns_are_the_expressions_on_every_real_name(real_names):
    assert real_names.height > 500  # twelve traces and the H200 runs: every vendor's names
    staged = kc.with_kernel_classes(real_names)
    assert staged.columns == ["name", *kc.KERNEL_CLASS_COLUMNS]
    for column, expression in EXPRESSIONS.items():
        one_off = real_names.select(expression.alias(column)).to_series()
        assert_series_equal(staged[column], one_off)
    # the names cover what the classes tell apart, so equality is not between empty columns
    assert set(staged["unit"].drop_nulls()) >= {"matrix", "vector", "memory", "communication"}
    assert set(staged["precision"].drop_nulls()) >= {"bf16", "fp16", "half", "tf32", "fp32"}
    assert staged["family"].n_unique() > 20


def test_classify_keeps_its_columns():
    table = kc.classify(["ampere_sgemm_32x32_sliced1x4_tn", "nvjet_sm90_tst_256x128_64x4"])
    assert table.columns == [
        "name",
        "family",
        "vendor",
        "unit",
        "tensor_core",
        "cuda_core_gemm",
        "precision",
    ]
    assert table["precision"].to_list() == ["fp32", "bf16"]
    assert table["tensor_core"].to_list() == [False, True]
