"""Every threshold the rules use, with its default and where that default comes from.

One frozen dataclass, :class:`Thresholds`. Each field carries ``metadata`` with ``doc`` (what
it means, with its unit) and ``source`` (the tool, paper or measurement the default is taken
from; "ours" says we chose it and why). The rule reference (``docs/RULES.md``) prints them.

Override any of them from one config: a mapping, or a TOML or JSON file whose top level (or
a ``[thresholds]`` table) maps field names to values::

    # thresholds.toml
    [thresholds]
    dataloader_share_min_pct = 10.0
    grad_spike_z = 3.0

    load_thresholds("thresholds.toml")  ->  Thresholds(dataloader_share_min_pct=10.0, ...)

Unknown names and values of the wrong type are refused with one line naming the file and the
field, so a typo never silently keeps a default.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path
from typing import Any


def _t(default: float | int, doc: str, source: str, minimum: float = 0) -> Any:
    return field(default=default, metadata={"doc": doc, "source": source, "minimum": minimum})


@dataclass(frozen=True)
class Thresholds:
    # -- low-gpu-utilization --------------------------------------------------------------
    gpu_util_low_pct: float = _t(
        50.0,
        "GPU busy share of the profiled steps (trace) below which the GPU counts as under-used, %",
        "torch-tb-profiler recommends a larger batch below 50% (tb_plugin profiler/data.py, "
        "_analyze_gpu_metrics)",
    )
    gpu_util_p95_low_pct: float = _t(
        70.0,
        "p95 of NVML utilisation samples (run) below which the GPU counts as under-used, %",
        "SageMaker Debugger LowGPUUtilization: p95 below 70% (profiler_rules/rules.py)",
    )
    gpu_util_min_samples: int = _t(
        10,
        "NVML samples needed before a run's utilisation is judged",
        "ours: 1 s at the sampler's 10 Hz; SageMaker evaluates windows of samples, not one",
    )
    # -- too-few-workers ------------------------------------------------------------------
    dataloader_share_min_pct: float = _t(
        5.0,
        "time blocked on the DataLoader, as a share of step time (median over steps), above "
        "which workers are recommended, %",
        "torch-tb-profiler recommends num_workers above 5% DataLoader time "
        "(tb_plugin profiler/data.py)",
    )
    dataloader_wait_min_ms: float = _t(
        1.0,
        "median per-step DataLoader wait below which no worker advice is given, ms",
        "ours: below 1 ms a worker process's IPC per batch costs about as much as it hides",
    )
    cores_reserved_for_main: int = _t(
        1,
        "CPU cores left to the training process when sizing num_workers",
        "Lightning suggests max(1, cpus // devices - 1) workers "
        "(trainer/connectors/data_connector.py)",
    )
    worker_headroom: float = _t(
        1.5,
        "workers recommended per worker strictly needed (load / compute): the margin that "
        "keeps the loader ahead of the step",
        "ours: compute measured in a loader-bound run shrinks once the loader moves out of the "
        "training process (measured 2.5x faster steps on the slow-loader e2e), so the bare "
        "ratio left the fixed run loader-bound; 1.5x kept it ahead",
    )
    worker_count_tolerance_pct: float = _t(
        10.0,
        "a whole worker count within this share of the headroom target is recommended as it "
        "is, instead of one more worker, %",
        "ours: the headroom is already a 1.5x margin; two identical script runs whose load / "
        "compute medians differed by noise either side of a whole count were told 2 and 3 "
        "workers",
    )
    # -- worker-restarts ------------------------------------------------------------------
    epoch_start_wait_ratio: float = _t(
        5.0,
        "an epoch's first step must wait this many times the median wait within epochs",
        "ours: forking workers and refilling the prefetch queue costs one batch load per "
        "worker; 5x the steady wait keeps ordinary jitter out",
    )
    epoch_start_wait_min_ms: float = _t(
        20.0,
        "and at least this much longer, ms",
        "ours: below 20 ms per epoch a restart is not worth a finding",
    )
    # -- missing-pin-memory ---------------------------------------------------------------
    pageable_h2d_min_bytes: int = _t(
        1_048_576,
        "total pageable host-to-device bytes below which pinning is not worth advising, bytes",
        "ours: Nsight's cuda_memcpy_async lists every pageable copy; below 1 MiB per trace "
        "they are scalars and shapes whose staging cost is negligible",
    )
    # -- unstable-gradients ---------------------------------------------------------------
    grad_spike_z: float = _t(
        2.5,
        "robust z-score of a step's gradient norm above which it is a spike",
        "ZClip (arXiv 2504.02507): spike when z > 2.5",
    )
    grad_warmup_steps: int = _t(
        25,
        "steps at the start ignored by the spike test (norms settle during warm-up)",
        "ZClip: 25 warm-up steps",
    )
    grad_window_steps: int = _t(
        32,
        "rolling window of previous steps for the median and MAD of the gradient norm",
        "ZClip's EMA with alpha = 0.97 weighs about 1 / (1 - 0.97) = 33 past steps",
    )
    grad_spike_min_ratio: float = _t(
        4.0,
        "a spike must also be this many times the rolling median gradient norm",
        "ours, measured: healthy fine-tuning of the reference model (batch 32) has single "
        "steps up to 3.1x the rolling median (a z above 2.5 from a small MAD); 4x stays "
        "clear of that, while real spikes are 10x and more",
    )
    loss_divergence_ratio: float = _t(
        2.0,
        "median loss of the last window over the best earlier windowed median above which "
        "the loss is diverging",
        "ours: Lightning's EarlyStopping has a divergence_threshold but no default; doubling "
        "the best loss is unambiguous",
    )
    loss_window_steps: int = _t(
        10,
        "window of steps for the loss medians in the divergence test",
        "ours: short enough for 50-step runs, long enough to smooth batch noise",
        minimum=1,  # a median of no steps is undefined
    )
    scaler_skip_share_max_pct: float = _t(
        5.0,
        "share of post-warm-up steps GradScaler skipped (its scale halved) above which "
        "fp16 training is unstable, %",
        "ours: GradScaler halves on each inf/NaN step and regrows every 2000 clean steps "
        "(torch.amp docs), so more than 1 in 20 is far beyond calibration",
    )
    scaler_scale_min: float = _t(
        1.0,
        "GradScaler scale below which the scale has collapsed",
        "ours: the scale starts at 2^16 (torch.amp docs); below 1 the loss is scaled down, "
        "so gradients overflow even unscaled",
    )
    # -- memory-leak ----------------------------------------------------------------------
    leak_warmup_share: float = _t(
        0.2,
        "share of the steps at the start excluded from the growth fit (allocator and caches "
        "warming up)",
        "ours: the first fifth covers optimiser state creation and the profiler's warm-up",
    )
    leak_min_increasing_share: float = _t(
        0.8,
        "after warm-up, of all pairs of steps (earlier, later) whose memory differs, the share "
        "where the later is higher (Mann-Kendall's trend statistic as a share)",
        "ours, measured on reference-trainer CPU runs (the scenario tests' set): 6 leak runs "
        "0.96-1.00; a rising line with a +50 MiB spike every 4th step 0.86; one jump in a "
        "flat line 0.74. Counting rising neighbours instead gave a leak run 0.72 against a "
        "bar of 0.7 and failed CI once; runs without the leak that still rose 0.82-0.84 grew "
        "under 2.5% and are stopped by leak_min_growth_pct",
    )
    leak_min_growth_pct: float = _t(
        5.0,
        "growth after warm-up (fitted slope x steps) relative to the post-warm-up baseline, %",
        "SageMaker Debugger GPUMemoryIncrease: moving average rising more than 5 points; "
        "measured on the reference trainer: at most 2.2% without the leak, 12.6% and more "
        "with it",
    )
    leak_min_steps: int = _t(
        10,
        "steps after warm-up needed to judge growth",
        "ours: Theil-Sen needs a handful of points; 10 tolerates 29% outliers reliably",
    )
    # -- memory-near-capacity -------------------------------------------------------------
    memory_capacity_high_pct: float = _t(
        90.0,
        "peak allocated (or used) memory as a share of the device's memory above which it is "
        "near capacity, %",
        "torch-tb-profiler: peak allocated above 90% of device memory (tb_plugin data.py)",
    )
    # -- memory snapshot rules (diagnostics/snapshot; docs/MEMORY.md) ----------------------
    snapshot_fragmentation_min_pct: float = _t(
        25.0,
        "free blocks inside partly used segments at dump time, as a share of reserved memory, "
        "above which the allocator counts as fragmented, %",
        "ours: the caching allocator keeps up to a segment's split remainder cached; a quarter "
        "of the reservation unusable for a larger request is what memory_viz's segment view "
        "shows as ragged segments",
    )
    snapshot_fragmentation_min_bytes: int = _t(
        256 * 2**20,
        "the same free split blocks in bytes, below which fragmentation is not worth a "
        "finding, bytes",
        "ours: less than one large (>1 MiB, 20 MiB-rounded) segment's worth a dozen times",
    )
    snapshot_activations_min_pct: float = _t(
        50.0,
        "activations' share of the bytes live at the peak above which they dominate it, %",
        "ours: half the peak; checkpointing then frees more than anything else could",
    )
    snapshot_optimizer_state_min_pct: float = _t(
        40.0,
        "optimizer state's share of the bytes live at the peak above which it dominates, %",
        "fp32 Adam keeps two states per parameter: 8 of the 16 bytes a parameter costs with "
        "its gradient (ZeRO paper, Rajbhandari et al. 2020, section 3.1)",
    )
    snapshot_oom_site_min_pct: float = _t(
        25.0,
        "share of the memory allocated at an out-of-memory error that one allocation site "
        "must hold to be named as its cause (below it, the largest sites are listed), %",
        "ours: a quarter of the device held by one line is what freeing that line changes; "
        "under it no single site explains the failure",
    )
    snapshot_leak_min_bytes: int = _t(
        16 * 2**20,
        "growth of one allocation site between two snapshots of the same phase above which "
        "it is a leak suspect, bytes",
        "ours: above the caching allocator's rounding of a few allocations (2 MiB segments)",
    )
    # -- host-device-sync -----------------------------------------------------------------
    sync_share_min_pct: float = _t(
        5.0,
        "GPU idle time while the host sat in a synchronisation call, as a share of step "
        "time (host blocked time when gaps are not attributed), %",
        "ours, the same bar as DataLoader time (torch-tb-profiler's 5%); Nsight's "
        "cuda_api_sync lists every sync call whatever it costs",
    )
    # -- launch-bound-kernels -------------------------------------------------------------
    short_kernel_share_min_pct: float = _t(
        50.0,
        "share of kernel launches that are short (GPU time below their launch time) above "
        "which the step is launch-bound, %",
        "HTA get_cuda_kernel_launch_stats: a short kernel runs shorter than its launch; we "
        "flag when they are the majority",
    )
    launch_delay_outlier_us: float = _t(
        100.0,
        "mean launch delay (runtime call start to kernel start) above which launches queue, µs",
        "HTA: launch-delay outliers above 100 µs",
    )
    # -- tensor-cores-unused --------------------------------------------------------------
    tensor_core_min_capability: int = _t(
        7,
        "NVIDIA compute capability major version from which the GPU has Tensor Cores (AMD: "
        "the rule's gfx list, CDNA gfx908 and newer, has Matrix Cores)",
        "NVIDIA Volta (7.0) introduced Tensor Cores; torch-tb-profiler checks the same",
    )
    tensor_core_eligible_min_pct: float = _t(
        10.0,
        "GPU time of Tensor-Core-eligible ops (matmul, conv, linear) as a share of kernel "
        "time above which AMP is worth it, %",
        "ours: torch-tb-profiler advises AMP whenever eligible ops run without Tensor Cores; "
        "below 10% of kernel time the saving is small",
    )
    tensor_core_used_max_pct: float = _t(
        5.0,
        "share of kernel time on Tensor Cores / Matrix Cores below which they count as unused, %",
        "ours: a few library kernels use Tensor Cores even in fp32 (TF32); 5% is incidental",
    )
    kernel_classified_min_pct: float = _t(
        90.0,
        "share of kernel time on kernels the kernel-family table knows below which a rule "
        "whose figure rests on classified time (tensor-cores-unused) says it could not tell, %",
        "ours: tensor-cores-unused fires under 5 % on matrix units; with more than a tenth of "
        "kernel time unread, that unread time could hold the matrix work, so the verdict is "
        "not given (the twelve traces in ../shared/traces classify 94.0 % (A100 AlexNet) to 100 %)",
    )
    tensor_core_bf16_step_ratio: float = _t(
        0.177,
        "step time of a GEMM-bound model with bf16 autocast over the same model in fp32 "
        "(GEMMs on CUDA cores); the saving estimate is (1 - this) x the share of step time "
        "in CUDA-core GEMMs",
        "measured: NVIDIA H200, this project's trainer, hidden 768, 6 layers, batch 256, "
        "128 tokens: p50 step 34.86 ms in bf16 vs 196.92 ms in fp32 (../shared/gpu-runs/"
        "h200-sized/m768l6b256 and m768l6b256-fp32 step records, PROVENANCE.md)",
    )
    # -- step-time-outliers ---------------------------------------------------------------
    step_outlier_sigma: float = _t(
        3.0,
        "a step slower than median + this many robust standard deviations (1.4826 x MAD) "
        "is an outlier",
        "SageMaker Debugger StepOutlier: 3 sigma (profiler_rules/rules.py); we measure sigma "
        "robustly, since outliers inflate the plain standard deviation",
    )
    step_outlier_min_excess_pct: float = _t(
        2.0,
        "time the outliers lose (above the median step) as a share of all step time below "
        "which they are not reported, %",
        "ours: an occasional slow step that costs under 2% is not worth a finding",
    )
    step_outlier_min_ratio: float = _t(
        1.5,
        "an outlier must also take at least this multiple of the median step",
        "ours: on a steady run the MAD is tiny and median + 3 sigma sits a few percent above "
        "the median; a step 1.5x the median is a slowdown a person would notice",
    )
    step_outlier_min_episodes: int = _t(
        3,
        "separate episodes of outlier steps (runs of consecutive outliers) needed before "
        "the slowdown counts as recurring",
        "ours: one burst (a neighbour's job, an epoch's worker start) is not a pattern; "
        "three separate ones are: on the healthy CPU scenario (3 seeds) the slow steps come "
        "in one or two bursts",
    )
    # -- batch-too-small ------------------------------------------------------------------
    batch_memory_low_pct: float = _t(
        50.0,
        "peak memory as a share of the device below which a larger batch fits, %",
        "ours: doubling the batch roughly doubles activations, so it fits below half",
    )
    # -- unused-embedding-rows ------------------------------------------------------------
    embedding_unused_min_pct: float = _t(
        20.0,
        "share of vocabulary rows the data never uses above which pruning is advised, %",
        "ours: the seed pipeline's vocabulary pruning paid off from about a fifth unused",
    )
    # -- rank-stragglers ------------------------------------------------------------------
    straggler_slowdown_pct: float = _t(
        10.0,
        "a rank whose mean step time exceeds the ranks' median by this much is a straggler, %",
        "ours: in synchronous data parallel every rank waits for the slowest; 10% is the "
        "usual noise band of step times on shared clusters",
    )

    # -- exposed-communication ------------------------------------------------------------
    exposed_comm_min_pct: float = _t(
        10.0,
        "communication not overlapped by compute, as a share of step time, above which it "
        "is reported, %",
        "torch-tb-profiler's distributed view flags communication above 10% of the step "
        "(docs/PEERS.md, its rules list)",
    )
    # -- rank-stragglers (cause) ----------------------------------------------------------
    straggler_cause_min_share_pct: float = _t(
        80.0,
        "a straggler's cause (data wait, host-to-device copies, compute) is named only when "
        "that part's excess over the median rank explains at least this share of its excess "
        "step time, %",
        "TraceML names a straggler's cause only when it explains at least 80% of the wait "
        "(docs/PEERS.md)",
    )
    straggler_late_share_pct: float = _t(
        50.0,
        "with collectives matched across ranks, a rank whose late starts caused at least this "
        "share of the waiting in the significant collectives is a straggler (and always more "
        "than halfway from the even share 100/N to 100), %",
        "ours: HTA's late-start signal (get_potential_stragglers) weighed by the wait each "
        "late start caused; with N ranks an even job makes each cause about 1/N of it",
    )
    # -- per-sample-lookups ---------------------------------------------------------------
    store_reads_per_sample_min: float = _t(
        0.5,
        "key-value read transactions per sample of a batch (median over steps) at or above "
        "which the reads count as one per sample",
        "ours: one get per sample is 1.0; batch_get makes one read per shard touched, at most "
        "shards / batch_size per sample (4 / 32 = 0.125 for the reference trainer)",
    )
    store_read_share_of_wait_min_pct: float = _t(
        25.0,
        "the batch's key-value read time as a share of the step's data wait (medians) above "
        "which the reads are what the step waits for, %",
        "ours: below a quarter of the wait other loading work dominates, and batching the "
        "reads cannot remove most of it",
    )

    # -- misshapen-matmul -----------------------------------------------------------------
    misshapen_gemm_min_share_pct: float = _t(
        5.0,
        "share of the counted GEMMs' GPU time in GEMMs with a dimension off the precision's "
        "Tensor Core alignment (and not measured as fast as aligned ones) above which it is "
        "reported, %",
        "ours: below a twentieth of GEMM time, padding saves less than the run-to-run noise "
        "of a step",
    )
    misshapen_gemm_min_slowdown_pct: float = _t(
        10.0,
        "a misaligned GEMM signature counts as slowed when its TFLOP/s is this far below the "
        "aligned GEMMs of similar size in the same trace, %",
        "ours: one aligned signature's calls spread by up to 5 % in the H200 traces "
        "(m768l6b256: 647-680 TFLOP/s over 72 calls of one addmm); a tenth is beyond that",
    )
    misshapen_gemm_compare_flops_ratio: float = _t(
        32.0,
        "aligned GEMMs compared with a misaligned one are those of the same precision whose "
        "FLOPs a call are within this factor of its own",
        "ours: a GPT-2 LM head (N = 50,257) does 16x the FLOPs of its MLP GEMMs; within 32x "
        "both fill an H100/H200 (tens of GFLOP a call), where the shape decides the rate",
        minimum=1.0,
    )

    # -- slow-matmul-shape ----------------------------------------------------------------
    slow_matmul_min_slowdown_x: float = _t(
        1.5,
        "a GEMM signature counts as slow when its median call takes this many times as long "
        "as the fastest GEMM of the same precision that did at least its FLOPs and bytes",
        "ours: equal-work GEMMs in another orientation differ by 1.10-1.36x in the shared "
        "H100/MI300X Qwen traces and the H200 runs; 1.43-1.56x (A100, resnet50) and 3.3x "
        "where a dimension of 64 or less meets a long K; 1.5x is beyond the first",
        minimum=1.0,
    )
    slow_matmul_min_saving_pct: float = _t(
        5.0,
        "share of the counted GEMMs' GPU time that running the slow GEMMs at the faster "
        "ones' call time would save, above which it is reported, %",
        "ours: as misshapen-matmul's share: below a twentieth of GEMM time the saving is "
        "within a step's run-to-run noise",
    )
    slow_matmul_min_step_saving_pct: float = _t(
        1.0,
        "where the profiled steps' time is known, the same saving as a share of it must "
        "also reach this, %",
        "ours: in HTA's A100 rank 0 of 16 two GEMM shapes took 1.6x and 3.3x their equal-"
        "work twins, 20 % of GEMM time, yet 0.04 % of its communication-bound steps: not "
        "worth a user's change",
    )

    @classmethod
    def field_docs(cls) -> list[tuple[str, Any, str, str]]:
        """(name, default, doc, source) for every threshold, in declaration order."""
        rows = []
        for f in fields(cls):
            default = f.default if f.default is not MISSING else None
            rows.append((f.name, default, f.metadata["doc"], f.metadata["source"]))
        return rows


class ThresholdsError(ValueError):
    """A thresholds config that cannot be used; the message is one line for the user."""


def _coerce(name: str, value: Any, default: Any, origin: str, minimum: float = 0) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ThresholdsError(f"{origin}: threshold {name!r} must be a number, got {value!r}")
    if not math.isfinite(value):  # TOML allows nan and inf
        raise ThresholdsError(f"{origin}: threshold {name!r} must be a finite number, got {value}")
    if isinstance(default, int) and not isinstance(default, bool):
        if isinstance(value, float) and not value.is_integer():
            raise ThresholdsError(f"{origin}: threshold {name!r} must be an integer, got {value}")
        value = int(value)
    else:
        value = float(value)
    if value < 0:
        raise ThresholdsError(f"{origin}: threshold {name!r} must not be negative, got {value}")
    if value < minimum:
        raise ThresholdsError(
            f"{origin}: threshold {name!r} must be at least {minimum:g}, got {value}"
        )
    return value


# names a thresholds file may still hold from an earlier version: read and ignored, since
# what they tuned is now measured
RETIRED = {
    # step-time-outliers judges each step's own time, its extra wait for a CPU left out,
    # so no share of that wait decides any more whether a slow step was the host's
    "step_outlier_cpu_wait_share",
}


def thresholds_from_mapping(
    values: Mapping[str, Any], *, origin: str = "thresholds", base: Thresholds | None = None
) -> Thresholds:
    """Thresholds with ``values`` overriding the defaults (or ``base``)."""
    base = base or Thresholds()
    if "thresholds" in values and isinstance(values["thresholds"], Mapping):
        values = values["thresholds"]
    known = {f.name: f for f in fields(Thresholds)}
    changes = {}
    for name, value in values.items():
        if name in RETIRED:
            continue
        if name not in known:
            raise ThresholdsError(
                f"{origin}: unknown threshold {name!r}; known: {', '.join(sorted(known))}"
            )
        spec = known[name]
        changes[name] = _coerce(name, value, spec.default, origin, spec.metadata["minimum"])
    return replace(base, **changes)


def load_thresholds(
    source: Thresholds | Mapping[str, Any] | str | os.PathLike[str] | None = None,
) -> Thresholds:
    """Defaults, or the defaults overridden by a mapping or a .toml / .json file."""
    if source is None:
        return Thresholds()
    if isinstance(source, Thresholds):
        return source
    if isinstance(source, Mapping):
        return thresholds_from_mapping(source)
    path = Path(source)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ThresholdsError(f"{path}: cannot read ({exc.strerror or exc})") from None
    try:
        if path.suffix.lower() == ".toml":
            import tomllib  # here: 3 ms of every analysis's imports, for a file few give

            values = tomllib.loads(raw.decode("utf-8"))
        elif path.suffix.lower() == ".json":
            values = json.loads(raw)
        else:
            raise ThresholdsError(f"{path}: thresholds config must be a .toml or .json file")
    except (ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, ThresholdsError):
            raise
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ThresholdsError(f"{path}: not valid {path.suffix[1:]} ({first_line})") from None
    if not isinstance(values, Mapping):
        raise ThresholdsError(f"{path}: top level must be a table of threshold names")
    return thresholds_from_mapping(values, origin=str(path))


DEFAULT_THRESHOLDS = Thresholds()
