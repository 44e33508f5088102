"""Which events are what: polars expressions over the event table, and the defaults of the
facts (thresholds borrowed from HTA and torch-tb-profiler), in one place."""

from __future__ import annotations

import polars as pl

from diagnostics.trace.schema import GPU_CATEGORIES, Category

# HTA's idle-time breakdown: a gap shorter than this between consecutive GPU events is the
# launch overhead of the next one ("kernel wait"), hta/analyzers/breakdown_analysis.py.
KERNEL_WAIT_MAX_US = 30.0
# HTA's get_cuda_kernel_launch_stats defaults: runtime_cutoff=50, launch_delay_cutoff=100.
SHORT_LAUNCH_MAX_US = 50.0
LAUNCH_DELAY_OUTLIER_US = 100.0

STEP_PREFIX = "ProfilerStep#"

# Host calls that block until the device catches up (Nsight's cuda_api_sync list plus the
# PyTorch ops that read a device scalar back).
SYNC_RUNTIME_NAMES: frozenset[str] = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        # ROCm (HIP) names the same calls hip*: the MI300X traces record hipDeviceSynchronize
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
    }
)
SYNC_OP_NAMES: frozenset[str] = frozenset({"aten::item", "aten::_local_scalar_dense"})
PAGEABLE_DTOH_COPY = "Memcpy DtoH (Device -> Pageable)"

GPU_CATS = pl.col("cat").is_in(sorted(GPU_CATEGORIES))
# Driver calls (cuLaunchKernel from Triton, ...) launch GPU work like runtime calls do.
RUNTIME = pl.col("cat").is_in([Category.CUDA_RUNTIME.value, Category.CUDA_DRIVER.value])
CPU_OP = pl.col("cat") == Category.CPU_OP.value
ANNOTATION = pl.col("cat") == Category.USER_ANNOTATION.value
DURATION = pl.col("ph") == "X"

# ProfilerStep#N is an Operator in PyTorch 1.9 traces and a user_annotation today.
STEP = (CPU_OP | ANNOTATION) & pl.col("name").str.starts_with(STEP_PREFIX) & DURATION
# ...and on the GPU timeline (current PyTorch) a gpu_user_annotation: the device-side span
# of the step's work, not a host range
GPU_STEP = (
    (pl.col("cat") == Category.GPU_USER_ANNOTATION.value)
    & pl.col("name").str.starts_with(STEP_PREFIX)
    & DURATION
    & pl.col("dur").is_not_null()
)
# GPU work with a duration: kernels, copies, sets
GPU_WORK = GPU_CATS & DURATION & pl.col("dur").is_not_null()
# torch-tb-profiler's DataLoader role (event_parser.py _parse_step): the iterator's __next__
# range, and DataPipe ranges; an Operator in old traces, a user_annotation in modern ones.
# The *_NAME forms apply to frames already restricted to cpu_op/user_annotation rows.
DATALOADER_NAME = (
    pl.col("name").str.starts_with("enumerate(DataLoader)#")
    & pl.col("name").str.ends_with(".__next__")
) | pl.col("name").str.starts_with("enumerate(DataPipe)#")
DATALOADER = (CPU_OP | ANNOTATION) & DURATION & DATALOADER_NAME
# Host-side work that is neither a step marker nor the DataLoader: torch-tb-profiler's
# "CPU Exec" role (operators and user annotations; python_function stack frames are left
# out, as the plugin leaves them out). torch-tb-profiler 0.4.3 drops user_annotation events
# before this point; we keep them.
HOST_EXEC_NAME = ~pl.col("name").str.starts_with(STEP_PREFIX) & ~DATALOADER_NAME
HOST_OP = (CPU_OP | ANNOTATION) & DURATION & ~pl.col("name").str.starts_with(STEP_PREFIX)


def select_where(frame: pl.DataFrame, predicate: pl.Expr, *columns: str | pl.Expr) -> pl.DataFrame:
    """``frame.filter(predicate).select(*columns)``, copying only the columns selected.

    An eager filter copies every column of the event table (31) for the rows it keeps
    before a select drops most of them: on the 1 GB trace's 3.9 M rows, selecting an
    operator's six columns that way took 4x the time and 2.3x the memory (0.12 s and
    +261 MB against 0.03 s and +112 MB).
    """
    return frame.lazy().filter(predicate).select(*columns).collect()


END_US = (pl.col("ts") + pl.col("dur").fill_null(0.0)).alias("end_us")
# Kineto puts the GPU index in args.device and, for GPU rows, in pid; prefer the former.
GPU_DEVICE = pl.coalesce(pl.col("device"), pl.col("pid")).alias("device")
