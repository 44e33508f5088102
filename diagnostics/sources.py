"""What the analysis reads from its two sources: one trace's facts and one run folder's data.

``TraceFacts`` is built once per trace by ``diagnostics.facts.compute_facts`` from the event
table; ``RankFacts``, the part of them the cross-rank summary reads, by
``diagnostics.facts.compute_rank_facts`` for every rank but the primary one; ``RunData`` once
per run folder through ``diagnostics.runs.RunFolder``. Each frame's
columns are listed beside it, with units in the names. Fields may be added; none renamed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

import polars as pl

from diagnostics.runs import DataLoaderRecord, RunFolder, RunManifest, RunStatus

if TYPE_CHECKING:
    from diagnostics.facts.comms import CommFacts
    from diagnostics.facts.coverage import KernelCoverage
    from diagnostics.facts.device import DeviceIdentity
    from diagnostics.facts.gpu_timeline import GpuTimeline
    from diagnostics.facts.precision import PrecisionFacts
    from diagnostics.facts.roofline import RooflineFacts
    from diagnostics.facts.trace_parts import TraceParts


@dataclass(frozen=True)
class TraceFacts:
    device: Literal["cuda", "cpu"]
    # step:int, start_us, end_us, dur_us (end extended to the end of the GPU work it launched)
    steps: pl.DataFrame
    # True when the trace had no ProfilerStep#N and the whole span stands in for one step
    steps_inferred: bool
    # step, kernel_us, memcpy_us, memset_us, runtime_us, dataloader_us, cpu_exec_us,
    # other_us, total_us: torch-tb-profiler's categories and priority; parts add up to total
    breakdown: pl.DataFrame
    # device, busy_us, span_us, utilization_pct: union of the kernels/memcpys/memsets launched
    # in the steps, over streams (busy_us, within the steps' span); utilization_pct is
    # torch-tb-profiler's definition (kernels only / span), with kernel_busy_us and busy_pct
    # (copies included) beside it; copy_busy_us, comm_busy_us, compute_busy_us,
    # copy_overlap_us, comm_overlap_us: per-kind unions and their overlap with compute
    gpu: pl.DataFrame
    # device, stream, start_us, end_us, dur_us, idle_kind (host_wait|kernel_wait|other),
    # host_activity (dataloader|sync|pageable_copy|cpu_ops|none): what the host did meanwhile
    # (+ dataloader_us, sync_us, pageable_copy_us, cpu_ops_us, step); device-wide gaps
    idle_gaps: pl.DataFrame
    # name, calls, host_us, device_us (device time linked through correlation ids)
    operators: pl.DataFrame
    # name, calls, device_us, mean_us, tensor_core:bool (Tensor/Matrix Cores), fp16:bool,
    # bf16:bool (named format), cuda_core_gemm:bool, precision (kernel_families.PRECISIONS or
    # null), family, unit (matrix|vector|memory|communication|null): facts/kernel_classes.py
    kernels: pl.DataFrame
    # direction (HtoD|DtoH|DtoD|HtoH|PtoP|Memset), src_memory, dst_memory (Pageable|Pinned|
    # Device|...), count, bytes, dur_us, bandwidth_gb_s
    copies: pl.DataFrame
    # name, count, total_us; plus blocked_us_per_step (float) in sync_per_step
    syncs: pl.DataFrame
    sync_per_step: pl.DataFrame  # step, sync_us, sync_count
    # name, count, kernel_us_mean, launch_us_mean, launch_delay_us_mean, short_count
    launches: pl.DataFrame
    # ts_us, device (-1 for CPU), allocated_bytes, reserved_bytes
    memory: pl.DataFrame
    device_properties: tuple[dict[str, Any], ...] = ()
    distributed: dict[str, Any] | None = None
    pytorch_version: str | None = None
    rank: int = 0
    # per-rank summary when several ranks were loaded: diagnostics.facts.ranks.RANKS_SCHEMA
    # (step times, step parts per step, communication, cross-rank wait and late arrivals)
    ranks: pl.DataFrame | None = None
    warnings: tuple[str, ...] = ()
    # device (-1 host), peak_allocated_bytes, peak_reserved_bytes, device_total_bytes,
    # peak_allocated_pct (of deviceProperties totalGlobalMem)
    memory_peak: pl.DataFrame | None = None
    # dtype (c10::Half | c10::BFloat16), ops: CPU operator calls with an input of that
    # 16-bit dtype (traces recorded with record_shapes); None when not computed
    op_half_dtypes: pl.DataFrame | None = None
    # collective time, overlap with compute, exposed time per step and the compact table of
    # collectives for cross-rank matching (diagnostics.facts.comms); None: no communication
    comms: CommFacts | None = None
    # fp16 training on the dense path versus fp16 data (embedding tables, communication
    # buffers), and GradScaler's ops (diagnostics.facts.precision); None when not computed
    precision: PrecisionFacts | None = None
    # TraceLens's GPU timeline (total, computation, exposed communication and copies, busy,
    # idle over the GPU-side step window): diagnostics.facts.gpu_timeline; None without GPU
    gpu_timeline: GpuTimeline | None = None
    # which parts the trace holds (CPU side, GPU activity, steps, links, CUDA graphs) and
    # which figures its missing parts leave unknown: diagnostics.facts.trace_parts
    parts: TraceParts | None = None
    # vendor, architecture, model of the GPU (diagnostics.facts.device); None: not computed
    device_identity: DeviceIdentity | None = None
    # how much kernel time the kernel-family table and the operator links account for
    # (diagnostics.facts.coverage); None: no kernels
    kernel_coverage: KernelCoverage | None = None
    # where in the user's code the host synced inside the steps, from the trace's Python
    # stacks (diagnostics.facts.sync_sites.SYNC_SITES_SCHEMA); None: the trace has no
    # python_function events (recorded without with_stack=True), so no site is known
    sync_sites: pl.DataFrame | None = None
    # FLOPs and bytes per operator call from the recorded shapes, achieved TFLOP/s and TB/s,
    # % of the device's peak, compute- or memory-bound, per call, signature and kernel
    # (diagnostics.facts.roofline); None: no operator call with a model (no shapes)
    roofline: RooflineFacts | None = None

    @property
    def host_side(self) -> bool:
        """The trace holds its CPU side (hand-built facts without ``parts`` are taken to)."""
        return self.parts is None or self.parts.host_side

    @property
    def device_memory_bytes(self) -> int | None:
        totals = [
            p.get("totalGlobalMem") for p in self.device_properties if p.get("totalGlobalMem")
        ]
        return int(totals[0]) if totals else None

    @property
    def compute_capability(self) -> tuple[int, int] | None:
        """deviceProperties' computeMajor/Minor as written. On AMD HIP echoes the gfx target
        there (9.4 = gfx942): read ``device_identity`` for what the GPU is."""
        for props in self.device_properties:
            if "computeMajor" in props:
                return int(props["computeMajor"]), int(props.get("computeMinor", 0))
        return None


@dataclass(frozen=True)
class RankFacts:
    """What the per-rank table and the cross-rank collective matching read of one rank
    (diagnostics.facts.ranks): the same frames as in its TraceFacts, nothing else computed.
    The primary rank has full TraceFacts; the others of a many-rank input only these."""

    rank: int
    device: Literal["cuda", "cpu"]
    steps: pl.DataFrame  # as TraceFacts.steps
    breakdown: pl.DataFrame  # as TraceFacts.breakdown
    gpu: pl.DataFrame  # as TraceFacts.gpu
    comms: CommFacts | None = None  # as TraceFacts.comms

    @classmethod
    def of(cls, facts: TraceFacts) -> RankFacts:
        return cls(facts.rank, facts.device, facts.steps, facts.breakdown, facts.gpu, facts.comms)


@dataclass(frozen=True)
class RunData:
    folder: RunFolder
    manifest: RunManifest
    status: RunStatus
    steps: pl.DataFrame  # diagnostics.runs.STEP_SCHEMA
    samples: pl.DataFrame  # diagnostics.runs.SAMPLE_SCHEMA
    memory_lines: pl.DataFrame | None  # diagnostics.runs.MEMORY_LINE_SCHEMA
    # script runs: the DataLoaders the script built, where and with which arguments
    dataloaders: tuple[DataLoaderRecord, ...] = ()

    @property
    def config(self) -> dict[str, Any]:
        return self.manifest.config

    @property
    def environment(self) -> dict[str, Any]:
        return self.manifest.environment

    @classmethod
    def read(cls, folder: RunFolder) -> RunData:
        return cls(
            folder=folder,
            manifest=folder.manifest(),
            status=folder.status(),
            steps=folder.steps(),
            samples=folder.samples(),
            memory_lines=folder.memory_lines(),
            dataloaders=folder.dataloaders(),
        )

    @property
    def kind(self) -> str:
        """``script`` (a user's script under pipeline-doctor profile) or ``trainer``."""
        return self.manifest.kind
