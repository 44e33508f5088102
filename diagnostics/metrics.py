"""The headline numbers of one analysis, computed once: what the cards, the rules' titles and
evidence, the comparison and the three report formats all quote.

Every figure is defined here and nowhere else (``docs/ANALYSIS.md`` repeats the definitions):

steady-state steps
    A run's step records with a step time, less the first step of each phase (``pretrain``,
    ``finetune``) when the phase has more than two: that step starts the DataLoader workers,
    builds the optimiser state and pays lazy initialisation that later steps do not pay
    again. A trace's profiler steps as found (the profiler's schedule already skips
    warm-up). Run records are preferred when both exist: they cover every step, the trace
    only the profiler's window.
median step time (ms)
    The median of the steady-state step times. Mean and p95 are kept beside it, labelled.
data-wait share (%)
    The median over steady-state steps of each step's ``data_wait_ms / step_time_ms``
    (a trace: ``dataloader_us / total_us`` of each profiler step), x 100. A median of
    per-step shares, so one stalled step (an epoch boundary restarting the workers) does not
    make a loader look slow, and half the steps waited at least this share.
throughput
    Derived from the median step: ``batch size / median step time`` in samples/s (the batch
    size is the median of the steady-state steps' ``batch_size``), else ``1 / median step``
    in steps/s when the batch size is unknown (a trace). A distributed run's records are
    rank 0's and its batch is one rank's share: the job's throughput is that times the
    world size (every rank takes a step of the same size in the same time).
GPU utilisation, kernel time (%): ``gpu_kernel_utilization_pct``
    What nvidia-smi and the TensorBoard plugin call "GPU utilisation": the share of time at
    least one kernel runs. The union of kernel intervals over all streams within the
    profiled steps' span (``TraceFacts.gpu.kernel_busy_us``) over that span, summed over
    devices: ``100 x sum(kernel_busy_us) / sum(span_us)`` (torch-tb-profiler's
    gpu_metrics_parser.calculate_gpu_utilization; 55.51 % and 70.27 % on its ResNet-50
    golden overviews). Without a CUDA trace, the mean NVML utilisation sampled while the
    steps ran, which NVML defines the same way (``gpu_utilization_source`` says which).
GPU busy (%): ``gpu_busy_pct``
    The union of kernels, copies and memsets over all streams (``TraceFacts.gpu.busy_us``)
    over the same span, summed over devices: HTA's and TraceLens's busy time. At least the
    kernel-time figure: copies and memsets with no kernel beside them count here only.
    Trace only: NVML samples no copy engines, so a run folder without a trace leaves it null.
``gpu_utilization_pct`` (kept from v1 for its readers)
    The busy figure for a trace, the NVML mean without one: prefer the two named figures.
MFU and counted FLOPs utilisation (%)
    ``mfu_pct``: the median over the steady-state steps of each step's model FLOPs (6N +
    12·L·H·Q·T per token from the reference trainer's config, or from the model a script's
    HF Trainer trained, times its tokens) over its step time and the device's dense peak
    for the run's precision; ``mfu_label`` says which. ``counted_flops_
    utilization_pct``: the median over profiler steps of the roofline's counted operator
    FLOPs over step time and the peak ("hardware FLOPs utilisation from counted
    operators"). Both None on CPU or an unknown device (diagnostics/facts/mfu.py).
peak memory (bytes)
    The largest CUDA peak (``cuda_peak_bytes``, else ``cuda_allocated_bytes``) in the run's
    step records, else the largest device allocation in the trace's ``[memory]`` events,
    else the host RSS of the run, else the host allocations in the trace's events. Its kind
    (``peak_memory_kind``) and window (``peak_memory_window``: all steps, the profiled
    window, or a snapshot's history) go with it wherever it is shown: a CPU run's host RSS
    over all its steps and the profiler's host allocations in three steps differ tenfold.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import polars as pl

from diagnostics.facts.mfu import mfu_facts

if TYPE_CHECKING:
    from diagnostics.sources import RunData, TraceFacts


ALL_STEPS = "all steps"
PROFILED_WINDOW = "profiled window"
SNAPSHOT_HISTORY = "snapshot history"

# how each kind of peak is named on a card, in a chart's legend, a report and the CLI
PEAK_MEMORY_NAMES = {
    "CUDA": "CUDA allocated",
    "host RSS": "host RSS",
    "host allocated": "host allocated",
}


def peak_memory_name(kind: str | None, window: str | None = None) -> str:
    """'host RSS (all steps)', 'CUDA allocated (profiled window)'; 'memory' when unknown."""
    name = PEAK_MEMORY_NAMES.get(kind or "", kind or "memory")
    return f"{name} ({window})" if window else name


# the labels every view, report and comparison gives the two GPU figures
GPU_KERNEL_UTILISATION = "GPU utilisation (kernel time, as nvidia-smi)"
GPU_BUSY = "GPU busy (kernels, copies, memsets)"


@dataclass(frozen=True)
class KeyMetrics:
    device: str | None
    steps: int | None  # step records (run) or profiler steps (trace)
    median_step_time_ms: float | None
    mean_step_time_ms: float | None
    p95_step_time_ms: float | None
    steps_per_s: float | None  # 1000 / median step time
    samples_per_s: float | None  # batch size x world size / median step time
    data_wait_pct: float | None  # median over steady steps of data wait / step time, %
    # v1's figure, kept for its readers: gpu_busy_pct for a trace, else the NVML mean
    gpu_utilization_pct: float | None
    peak_memory_bytes: int | None
    peak_memory_kind: str | None  # "CUDA" (device), "host allocated" or "host RSS"
    source: str  # "run" (step records) or "trace"
    batch_size: int | None = None  # median batch size of the steady steps
    # "trace" or "NVML": where gpu_kernel_utilization_pct (and gpu_utilization_pct) came from
    gpu_utilization_source: str | None = None
    steady_steps: int | None = None  # the steady-state steps the medians are over
    # kernel time / span of the profiled steps, % (as nvidia-smi); NVML's mean without a trace
    gpu_kernel_utilization_pct: float | None = None
    gpu_busy_pct: float | None = None  # kernels, copies, memsets / span, % (trace only)
    # model FLOPs utilisation: median over steady steps of 6N + 12·L·H·Q·T per token from the
    # trainer's config (a script run's: the model its HF Trainer trained) x tokens / step
    # time / dense peak, % (facts/mfu.py); None on CPU, on an unknown device or precision,
    # or without the model's sizes
    mfu_pct: float | None = None
    # hardware FLOPs utilisation from counted operators: median over profiler steps of the
    # roofline's counted FLOPs / step time / dense peak, % (facts/mfu.py)
    counted_flops_utilization_pct: float | None = None
    # the peak each of the two is a share of ("H200 SXM dense bf16 989.5 TFLOP/s")
    mfu_peak_basis: str | None = None
    counted_flops_peak_basis: str | None = None
    # what mfu_pct's model FLOPs came from: facts/mfu.py's MODEL_LABEL (a trainer run's
    # config) or a script run's recorded model ("MFU (model FLOPs from the HF Trainer's model)")
    mfu_label: str | None = None
    # over which window peak_memory_bytes is the peak: ALL_STEPS (a run's step records),
    # PROFILED_WINDOW (a trace's memory events) or SNAPSHOT_HISTORY (a CUDA memory snapshot)
    peak_memory_window: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def finite_or_none(value: Any) -> float | None:
    """A finite number as a float; None for None, a bool, a non-number, NaN or infinity."""
    if value is None or isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def steady_steps(steps: pl.DataFrame) -> pl.DataFrame:
    """A run's steady-state step records (see the module docstring), in step order."""
    timed = steps.filter(pl.col("step_time_ms").is_not_null()).sort("step")
    if timed.height == 0:
        return timed
    if "phase" in timed.columns and timed["phase"].null_count() < timed.height:
        group = pl.col("phase").fill_null("")
        rank = pl.int_range(pl.len()).over(group)
        size = pl.len().over(group)
        steady = timed.filter((rank > 0) | (size <= 2))
    else:
        steady = timed.slice(1) if timed.height > 2 else timed
    return steady if steady.height else timed


def median_share_pct(part: pl.Series, total: pl.Series) -> float | None:
    """Median over steps of part / total, % (steps without both, or a zero total, left out)."""
    frame = pl.DataFrame({"part": part.cast(pl.Float64), "total": total.cast(pl.Float64)})
    shares = frame.filter(
        pl.col("part").is_not_null() & pl.col("total").is_not_null() & (pl.col("total") > 0)
    ).select(pl.col("part") / pl.col("total") * 100.0)
    return finite_or_none(shares.to_series().median()) if shares.height else None


def _step_stats(step_ms: pl.Series) -> dict[str, float | None]:
    values = step_ms.cast(pl.Float64).drop_nulls().drop_nans()
    if values.len() == 0:
        return {}
    median = finite_or_none(values.median())
    return {
        "median_step_time_ms": median,
        "mean_step_time_ms": finite_or_none(values.mean()),
        "p95_step_time_ms": finite_or_none(values.quantile(0.95, "linear")),
        "steps_per_s": 1000.0 / median if median else None,
    }


def _world_size(run: RunData) -> int:
    extra = getattr(run.manifest, "extra", None)
    info = extra.get("distributed") if isinstance(extra, dict) else None
    size = info.get("world_size") if isinstance(info, dict) else None
    return size if isinstance(size, int) and not isinstance(size, bool) and size > 0 else 1


def _run_values(run: RunData) -> dict[str, Any]:
    steady = steady_steps(run.steps)
    out: dict[str, Any] = {"steps": run.steps.height, "steady_steps": steady.height}
    if steady.height == 0:
        return out
    out.update(_step_stats(steady["step_time_ms"]))
    batch = steady["batch_size"].drop_nulls().median() if "batch_size" in steady.columns else None
    if batch is not None and out.get("median_step_time_ms"):
        out["batch_size"] = int(batch)
        job_batch = float(batch) * _world_size(run)
        out["samples_per_s"] = job_batch / (out["median_step_time_ms"] / 1000.0)
    if "data_wait_ms" in steady.columns:
        out["data_wait_pct"] = median_share_pct(steady["data_wait_ms"], steady["step_time_ms"])
    for column in ("cuda_peak_bytes", "cuda_allocated_bytes"):
        peak = run.steps[column].max() if column in run.steps.columns else None
        if peak is not None:
            out["peak_memory_bytes"], out["peak_memory_kind"] = int(peak), "CUDA"
            break
    return out


def _nvml_utilization(run: RunData) -> float | None:
    samples = run.samples
    if samples.height == 0 or "gpu_util_pct" not in samples.columns:
        return None
    rows = samples.filter(pl.col("gpu_util_pct").is_not_null())
    if rows.height and "wall_time" in run.steps.columns and run.steps.height:
        # only samples taken while steps ran: start-up and shutdown idle is not the loop's
        first, last = run.steps["wall_time"].min(), run.steps["wall_time"].max()
        if first is not None and last is not None:
            during = rows.filter(pl.col("wall_time").is_between(first, last))
            rows = during if during.height else rows
    return finite_or_none(rows["gpu_util_pct"].mean()) if rows.height else None


def trace_gpu_busy_pct(trace: TraceFacts) -> float | None:
    """GPU busy: 100 x sum(busy_us) / sum(span_us) over the trace's devices (None without
    GPU work)."""
    gpu = trace.gpu
    if gpu.height == 0:
        return None
    span = float(gpu["span_us"].sum())
    return 100.0 * float(gpu["busy_us"].sum()) / span if span > 0 else None


# the earlier name of the busy figure, for callers not yet moved
trace_gpu_utilization_pct = trace_gpu_busy_pct


def trace_gpu_kernel_utilization_pct(trace: TraceFacts) -> float | None:
    """GPU utilisation as nvidia-smi defines it: 100 x sum(kernel_busy_us) / sum(span_us)
    over the trace's devices (None without GPU work). A hand-built gpu frame without
    kernel_busy_us gives its utilization_pct, weighted by span."""
    gpu = trace.gpu
    if gpu.height == 0:
        return None
    span = float(gpu["span_us"].sum())
    if span <= 0:
        return None
    if "kernel_busy_us" in gpu.columns:
        return 100.0 * float(gpu["kernel_busy_us"].sum()) / span
    if "utilization_pct" in gpu.columns:
        return float((gpu["utilization_pct"] * gpu["span_us"]).sum()) / span
    return None


def _trace_values(trace: TraceFacts) -> dict[str, Any]:
    out: dict[str, Any] = {"steps": trace.steps.height, "steady_steps": trace.steps.height}
    out.update(_step_stats(trace.steps["dur_us"] / 1000.0))
    breakdown = trace.breakdown
    # A trace without its CPU side has no DataLoader ranges to see: the wait is unknown.
    if breakdown.height and "dataloader_us" in breakdown.columns and trace.host_side:
        out["data_wait_pct"] = median_share_pct(breakdown["dataloader_us"], breakdown["total_us"])
    return out


def _trace_peak_memory(trace: TraceFacts) -> tuple[int, str] | None:
    memory = trace.memory
    if memory.height == 0 or "allocated_bytes" not in memory.columns:
        return None
    device_rows = memory.filter(pl.col("device") >= 0) if "device" in memory.columns else memory
    if device_rows.height and device_rows["allocated_bytes"].max() is not None:
        return int(device_rows["allocated_bytes"].max()), "CUDA"
    peak = memory["allocated_bytes"].max()
    return (int(peak), "host allocated") if peak is not None else None


def _peak_memory(
    values: dict[str, Any], trace: TraceFacts | None, run: RunData | None
) -> tuple[int, str, str] | None:
    """(bytes, kind, window) of the headline peak: a run's CUDA records, a trace's CUDA
    memory, a run's host RSS, a trace's host allocations, in that order."""
    if values.get("peak_memory_bytes") is not None:  # the run's CUDA records
        return int(values["peak_memory_bytes"]), str(values["peak_memory_kind"]), ALL_STEPS
    in_trace = _trace_peak_memory(trace) if trace is not None else None
    if in_trace is not None and in_trace[1] == "CUDA":
        return (*in_trace, PROFILED_WINDOW)
    rss = None
    if run is not None and "rss_bytes" in run.steps.columns:
        rss = run.steps["rss_bytes"].max()
    if rss is not None:
        return int(rss), "host RSS", ALL_STEPS
    return (*in_trace, PROFILED_WINDOW) if in_trace is not None else None


def _device(trace: TraceFacts | None, run: RunData | None) -> str | None:
    if run is not None:
        raw = run.environment.get("device") or run.config.get("device")
        if isinstance(raw, str) and raw and raw != "auto":
            return "cuda" if raw.lower().startswith("cuda") else "cpu"
    return trace.device if trace is not None else None


def compute_key_metrics(trace: TraceFacts | None, run: RunData | None) -> KeyMetrics:
    """The key metrics of a trace and/or a run (run records first; see the module docstring)."""
    has_run = run is not None and run.steps.height > 0
    values: dict[str, Any] = {}
    if has_run:
        assert run is not None
        values = _run_values(run)
    elif trace is not None:
        values = _trace_values(trace)
    elif run is not None:
        values = {"steps": 0}
    if trace is not None and has_run and values.get("data_wait_pct") is None:
        values["data_wait_pct"] = _trace_values(trace).get("data_wait_pct")
    gpu_source = None
    busy = trace_gpu_busy_pct(trace) if trace is not None else None
    kernel_util = trace_gpu_kernel_utilization_pct(trace) if trace is not None else None
    util = busy
    if busy is not None:
        gpu_source = "trace"
    elif run is not None:
        # NVML's utilisation is kernel time per sample period: the kernel-time figure
        util = kernel_util = _nvml_utilization(run)
        gpu_source = "NVML" if util is not None else None
    # device memory first, then the host's; a run's records (all steps) before a trace's
    # window of the same kind, so the figure is the one the run's memory chart shows
    peak = _peak_memory(values, trace, run if has_run else None)
    if peak is not None:
        values["peak_memory_bytes"], values["peak_memory_kind"], window = peak
    else:
        window = None
    mfu = mfu_facts(trace, run, steady_steps(run.steps) if has_run and run is not None else None)
    return KeyMetrics(
        device=_device(trace, run),
        steps=values.get("steps"),
        median_step_time_ms=values.get("median_step_time_ms"),
        mean_step_time_ms=values.get("mean_step_time_ms"),
        p95_step_time_ms=values.get("p95_step_time_ms"),
        steps_per_s=values.get("steps_per_s"),
        samples_per_s=values.get("samples_per_s"),
        data_wait_pct=values.get("data_wait_pct"),
        gpu_utilization_pct=util,
        peak_memory_bytes=values.get("peak_memory_bytes"),
        peak_memory_kind=values.get("peak_memory_kind"),
        peak_memory_window=window,
        source="run" if has_run else "trace",
        batch_size=values.get("batch_size"),
        gpu_utilization_source=gpu_source,
        steady_steps=values.get("steady_steps"),
        gpu_kernel_utilization_pct=kernel_util,
        gpu_busy_pct=busy,
        mfu_pct=mfu.model.median_pct if mfu.model is not None else None,
        counted_flops_utilization_pct=mfu.counted.median_pct if mfu.counted is not None else None,
        mfu_peak_basis=mfu.model.peak_basis if mfu.model is not None else None,
        counted_flops_peak_basis=mfu.counted.peak_basis if mfu.counted is not None else None,
        mfu_label=mfu.model.label if mfu.model is not None else None,
    )


def key_metrics(result: Any) -> KeyMetrics:
    """The key metrics of an AnalysisResult: the ones the analysis computed, else computed
    now from its facts and run (results built by hand in tests carry none)."""
    metrics = getattr(result, "metrics", None)
    if isinstance(metrics, KeyMetrics):
        return metrics
    return compute_key_metrics(getattr(result, "facts", None), getattr(result, "run", None))
