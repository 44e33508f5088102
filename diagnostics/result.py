"""The analysis result: what the CLI prints, the app shows and the reports render.

``AnalysisResult.to_json()`` is the versioned JSON document (``SCHEMA``). Every key listed
in ``SUMMARY_KEYS`` is always present in ``summary``: null when it does not apply (a CPU
run has no GPU utilisation, a run without a trace has no breakdown), never missing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from diagnostics.metrics import KeyMetrics
from diagnostics.rules.base import Finding, Skipped
from diagnostics.sources import RankFacts, RunData, TraceFacts

if TYPE_CHECKING:
    from diagnostics.snapshot.analysis import SnapshotFacts
    from diagnostics.snapshot.compare import SnapshotGrowth

SCHEMA = "pipeline-doctor/analysis/v1"

BREAKDOWN_KEYS = ("kernel", "memcpy", "memset", "runtime", "dataloader", "cpu_exec", "other")
# the parts a trace without its CPU side still measures
GPU_BREAKDOWN_KEYS = ("kernel", "memcpy", "memset")
IDLE_KEYS = ("host_wait", "kernel_wait", "other")
STEP_TIME_KEYS = ("mean", "p50", "p95")

# summary key -> what it holds (units in the names; docs/ANALYSIS.md's table is this one).
SUMMARY_KEYS: dict[str, str] = {
    "device": '"cuda" or "cpu": where the training ran',
    "steps": "steps measured: run step records (run folder) or ProfilerStep#N (trace)",
    "step_time_ms": "{mean, p50, p95} of steady-state step time, ms (p50 is the median "
    "every view quotes; see diagnostics/metrics.py)",
    "breakdown_pct": "{kernel, memcpy, memset, runtime, dataloader, cpu_exec, other}: "
    "share of profiled step time, % (torch-tb-profiler's categories and priority)",
    "gpu_kernel_utilization_pct": "GPU utilisation as nvidia-smi and the TensorBoard plugin "
    "define it: the union of kernel time (all streams) over the profiled steps' span, %; "
    "without a CUDA trace the mean NVML utilisation (the same definition, sampled)",
    "gpu_busy_pct": "GPU busy: the union of kernels, copies and memsets (all streams) over the "
    "profiled steps' span, % (HTA's and TraceLens's busy time); null without a CUDA trace",
    "gpu_utilization_pct": "kept from v1 for its readers: gpu_busy_pct for a trace, the mean "
    "NVML utilisation without one; prefer the two named figures above",
    "gpu_busy_us": "union of the GPU work (kernels, copies, memsets, every stream, each "
    "instant once) launched in the profiled steps, µs",
    "gpu_copy_us": "union of memory copies (memcpy) in gpu_busy_us, µs",
    "gpu_copy_overlap_us": "copy time that ran while compute kernels ran, µs",
    "gpu_copy_overlap_pct": "gpu_copy_overlap_us over gpu_copy_us, % (null without copies)",
    "gpu_comm_us": "union of communication kernels (every family: NCCL/RCCL, symmetric "
    "memory, vLLM custom all-reduce, DeepEP, NVSHMEM) in gpu_busy_us, µs",
    "gpu_comm_overlap_us": "communication time that ran while compute kernels ran, µs",
    "gpu_comm_overlap_pct": "gpu_comm_overlap_us over gpu_comm_us, % (null without communication)",
    "gpu_idle_breakdown_pct": "{host_wait, kernel_wait, other}: share of GPU idle time, %",
    "step_time_source": '"run" (per-step records) or "trace" (profiler steps)',
    "steps_inferred": "true when the trace had no ProfilerStep#N (whole span = one step)",
    "trace_steps": "profiled steps in the trace",
    "samples_per_s": "throughput derived from the median step: batch size (x world size for "
    "a distributed run) / median step time, samples/s",
    "data_wait_pct": "median over steady-state steps of data wait / step time, % (run "
    "records, else the trace's DataLoader ranges per profiler step)",
    "peak_memory_bytes": "peak memory, bytes: CUDA allocated (run records, else the trace), "
    "else the run's host RSS, else the trace's host allocations",
    "peak_memory_kind": '"CUDA" (allocated), "host RSS" or "host allocated": which memory '
    "peak_memory_bytes is",
    "peak_memory_window": '"all steps" (run records), "profiled window" (the trace) or '
    '"snapshot history" (a CUDA memory snapshot): over which window it is the peak',
    "events": "rows of the event table (all ranks)",
    "ranks": "several ranks: {count, table: [per-rank rows], spread: step-time spread}",
    "comm_source": '"gpu_kernels" (communication kernels) or "host_ops" (CPU/gloo '
    "collectives); null: no communication in the trace",
    "comm_collective_us": "union of communication over the profiled steps, µs",
    "comm_overlap_pct": "share of communication overlapped by compute, % (HTA's "
    "get_comm_comp_overlap; CPU traces: by the training loop thread's operators)",
    "comm_exposed_us": "communication with no compute beside it, over the profiled steps, µs",
    "comm_exposed_us_per_step": "mean exposed communication per profiled step, µs",
    "comm_exposed_pct": "exposed communication over summed step time, %",
    "comm_families": "[{family, collectives, busy_us, collective_names}]: communication by "
    "family (nccl, symmetric_memory, vllm_custom_all_reduce, deepep, nvshmem; host: c10d, "
    "symmetric_memory_op, vllm_collective_op), most time first; busy_us sums the "
    "collectives' durations over the whole trace; collective_names as PyTorch recorded them",
    "comm_ranks": "two or more ranks: {matched_collectives, significant_collectives, "
    "skew_us_p50, skew_us_max, per_rank: [{rank, matched, collective_us, wait_us, "
    "transfer_us, wait_pct, late_count, late_share_pct, caused_wait_share_pct}]}: "
    "collectives matched across ranks",
    "gpu_timeline": "TraceLens's GPU timeline of the trace: {window (gpu_profiler_steps: the "
    "GPU-side ProfilerStep#N ranges, else gpu_activity: first to last GPU activity), "
    "window_start_us, window_end_us, total_us, computation_us, exposed_comm_us, "
    "exposed_memcpy_us, busy_us, idle_us, comm_us, memcpy_us, busy_pct, idle_pct}; computation "
    "+ exposed communication + exposed copies + idle = total (diagnostics/facts/gpu_timeline.py)",
    "trace_parts": "what the trace holds: {host_ops, runtime_calls, gpu_events, "
    "counter_ranges, host_steps, gpu_steps, gpu_linked, gpu_before_recording, "
    "gpu_unlinked_in_recording, graph_kernels, graph_kernel_share_pct, lacks: [{part, "
    "figures}]}: each missing part and the figures it leaves unknown (null in this summary) "
    "or estimated (diagnostics/facts/trace_parts.py)",
    "kernel_coverage": "a trace with kernels: {kernel_us, classified_pct, by_unit_pct: {matrix, "
    "vector, memory, communication, unknown}, by_precision_pct: {<precision>|unknown: %}, "
    "unknown_kernels: [{name, calls, device_us}] (largest 10), unknown_kernel_count, "
    "operator_attributed_pct}: shares of summed kernel time the kernel-family table "
    "classifies and that link to a CPU operator (null: no CPU operators); docs/KERNELS.md",
    "roofline": "a GPU trace recorded with shapes: {device_peak: {device, bf16_tflops, "
    "fp16_tflops, tf32_tflops, fp32_tflops, fp8_tflops, hbm_tbps, source} or null (unknown "
    "device: every pct_of_peak and bound null), modelled_calls, counted_gflops, counted_gpu_us, "
    "matrix_gflops, signatures: [{name, kind, shape, dtype, calls, gflops, mbytes, gpu_us, "
    "tflops_per_s, tflops_per_s_median, tb_per_s, flops_per_byte, pct_of_peak_flops, "
    "pct_of_peak_bandwidth, bound}] (largest 20 by GPU time), kernels: [{name, flops, bytes, "
    "device_us, tflops_per_s, tb_per_s, flops_per_byte, pct_of_peak_flops, "
    "pct_of_peak_bandwidth, bound}] (largest 20)}; FLOP and byte model per operator: "
    "docs/ROOFLINE.md",
    "mfu": "FLOPs utilisation per step, two ways (diagnostics/facts/mfu.py, docs/ROOFLINE.md): "
    "{model: MFU from the reference trainer's config (a script run's: from the model its HF "
    "Trainer trained, run.json model_shape, x each step's real tokens), 6N + 12·L·H·Q·T per "
    "token x tokens / step time / the dense peak of the run's precision, over the "
    "steady-state steps; counted: "
    "hardware FLOPs utilisation from counted operators, the roofline's counted FLOPs per "
    "profiler step / step time / the peak}; each {label, median_pct, median_tflops_per_s, "
    "precision, peak_tflops, device_peak, source, flops_per_token, gpu_time_covered_pct, "
    "unknown_reason, steps: [{step, phase, step_time_ms, flops, tflops_per_s, pct}]} or null; "
    "null: a CPU run without a GPU trace",
    "findings_by_severity": "{high, medium, low}: number of findings",
    "trace_run_steps": "run folder with a trace: [{trace_step, run_step}], the profiler's "
    "steps matched to the run's step records on one clock",
    "memory_snapshot": "a CUDA memory snapshot (uploaded, or a run folder's memory/*.pickle): "
    "{source, device, generation, pickle_protocol, entries, dump: {reserved_bytes, "
    "allocated_bytes, awaiting_free_bytes, active_bytes, inactive_bytes, segments, blocks, "
    "phase}, peak: {allocated_bytes, reserved_bytes, max_reserved_bytes, seq, time_s} (null "
    "without trace entries), sites_at_peak / sites_at_dump: [{site, label, user_code, bytes, "
    "blocks, category, phase, stack}], categories_at_peak / categories_at_dump: [{category, "
    "bytes, blocks, pct}], category_method, fragmentation: {cached_free_bytes, "
    "inactive_split_blocks, inactive_split_bytes, largest_free_block_bytes, "
    "peak_cached_free_bytes, failed_request_bytes, expandable_segments}, oom: {requested_bytes, "
    "device_free_bytes, allocated_bytes, reserved_bytes, cached_free_bytes, seq, time_s, "
    "sites} or null, allocator_settings, warnings, growth: {before, after, phase_before, "
    "phase_after, same_phase, growth_bytes, sites: [{site, bytes_before, bytes_after, "
    "growth_bytes, ...}]} or null}; docs/MEMORY.md",
}


def _clean(value: Any) -> Any:
    """JSON-safe: NaN/inf to null, numpy/polars scalars to Python, tuples to lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_clean(v) for v in value]
    item = getattr(value, "item", None)
    if callable(item):
        try:
            return _clean(item())
        except (TypeError, ValueError):
            pass
    to_list = getattr(value, "to_list", None)
    if callable(to_list):
        return _clean(to_list())
    to_dicts = getattr(value, "to_dicts", None)
    if callable(to_dicts):
        return _clean(to_dicts())
    return str(value)


@dataclass(frozen=True)
class AnalysisResult:
    source: dict[str, Any]  # kind "trace"|"ranks"|"run"|"snapshot", path, files, ranks
    summary: dict[str, Any]  # SUMMARY_KEYS, always all present
    facts: TraceFacts | None  # the primary rank's (rank 0, else the lowest)
    run: RunData | None
    findings: tuple[Finding, ...]
    skipped: tuple[Skipped, ...] = ()
    warnings: tuple[str, ...] = ()
    environment: dict[str, Any] = field(default_factory=dict)
    # informational lines (how an input was read: rank numbering, label pids, ...)
    notes: tuple[str, ...] = ()
    # every rank's part of the facts the per-rank table reads (RankFacts), by rank, when
    # several ranks were analysed (the primary's full facts are ``facts``)
    rank_facts: tuple[RankFacts, ...] = ()
    # the headline numbers every view quotes (diagnostics.metrics), computed once
    metrics: KeyMetrics | None = None
    # a CUDA memory snapshot analysed, and its growth from an earlier one (docs/MEMORY.md)
    snapshot: SnapshotFacts | None = None
    snapshot_growth: SnapshotGrowth | None = None

    @property
    def is_run_folder(self) -> bool:
        """A run folder, the reference trainer's or a profiled script's (not an uploaded
        trace): only then do findings carry patches (trainer keys, or DataLoader overrides
        for a script) and the views offer re-runs."""
        return self.run is not None

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "source": _clean(self.source),
            "environment": _clean(self.environment),
            "summary": _clean(self.summary),
            "findings": [_clean(f.to_dict()) for f in self.findings],
            "skipped": [{"rule": s.rule, "reason": s.reason} for s in self.skipped],
            "warnings": list(self.warnings),
            "notes": list(self.notes),
        }
