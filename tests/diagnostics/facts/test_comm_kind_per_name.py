"""The communication classifier run once per distinct name (with_comm_kind: each row then a
membership test and its category) gives each row exactly what the per-row expression gives,
on real traces of every vendor and family. Names that come in several categories (NCCL's
``nccl:all_reduce`` on the host and on the GPU) keep the category's part of the rule: without
it, 3 or 4 of these traces fail."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from polars.testing import assert_series_equal

from diagnostics.facts import gpu as gpu_facts
from diagnostics.facts.comms import comm_kind_expr, with_comm_kind
from diagnostics.facts.kernel_classes import COMMUNICATION
from diagnostics.facts.linking import build_index
from diagnostics.trace.loader import load

TRACES = Path(__file__).resolve().parents[4] / "shared" / "traces"
REAL = (
    "hta_a100_ddp_resnet_rank0_of_2_nccl.json.gz",  # NCCL kernels and host collectives
    "tracelens_b200_vllm_moe_mxfp4_rank0_of_8.json.gz",  # symmetric-memory all-reduce
    "tracelens_mi300x_resnet_ddp_actckpt_rank0_of_8.json.gz",  # RCCL
    "hta_v100_rank1_of_2_large.json.gz",
)


@pytest.mark.parametrize("name", REAL)
def test_each_rows_kind_is_the_per_row_expressions(name):
    events = load(TRACES / name).traces[0].events
    joined = with_comm_kind(events)
    assert joined.height == events.height
    assert joined.drop("_comm_kind").equals(events)  # rows and their order kept
    per_row = events.select(comm_kind_expr().alias("_comm_kind")).to_series()
    assert_series_equal(joined["_comm_kind"], per_row)
    assert per_row.drop_nulls().len() > 0  # each trace has communication to classify


@pytest.mark.parametrize("name", REAL)
def test_gpu_kinds_split_kernels_as_the_name_expression_does(name):
    index = build_index(load(TRACES / name).traces[0].events)
    kernels = index.gpu.filter(pl.col("cat") == "kernel")
    comm = kernels.filter(gpu_facts._kind(index, "comm"))
    compute = kernels.filter(gpu_facts._kind(index, "compute"))
    assert comm.equals(kernels.filter(COMMUNICATION))
    assert compute.equals(kernels.filter(~COMMUNICATION))
    assert comm.height > 0 and compute.height > 0
