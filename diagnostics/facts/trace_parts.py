"""Which parts a trace holds, and which figures its missing parts leave unknown.

Real traces lack parts in ways that differ from file to file: a GPU-only trace has no CPU
side at all; a CUPTI range-profiler trace has counter ranges but no kernel timeline; a
trace recorded without ``prof.step()`` has no ``ProfilerStep`` ranges; kernels queued before
the recording began have no launching call; kernels replayed from a CUDA graph share one
``cudaGraphLaunch`` and have no operator of their own. Each case is handled one way: the
part is counted here, the result says what is absent (``lacks``: the part, and the figures
it leaves unknown or estimated), those figures are null, and the rules that need the part
declare it (``rules/base.py`` ``Need``) and stay silent.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from diagnostics.facts import selectors as sel
from diagnostics.facts.linking import TraceIndex

# Kineto's category for CUPTI range-profiler records (ActivityType CUDA_PROFILER_RANGE).
COUNTER_RANGE_CATEGORY = "cuda_profiler_range"
# Host calls that launch GPU work: their presence says the job ran on a GPU even when the
# trace holds no GPU activity (CUDA, the driver API, HIP).
LAUNCH_CALL_PREFIXES = ("cudaLaunch", "cuLaunch", "hipLaunch", "hipExtLaunch", "hipModuleLaunch")
# Launches of a captured graph: every kernel of the replay carries this call's correlation.
GRAPH_LAUNCH_NAMES = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})


@dataclass(frozen=True)
class Lack:
    part: str  # what the trace does not hold
    figures: str  # which figures are therefore unknown, estimated or left out


@dataclass(frozen=True)
class TraceParts:
    host_ops: int  # cpu_op / user_annotation duration events (ProfilerStep included)
    runtime_calls: int  # CUDA/HIP runtime and driver calls
    launch_calls: int  # the calls among them that launch GPU work
    gpu_events: int  # kernels, copies and memsets
    counter_ranges: int  # CUPTI range-profiler records
    host_steps: int  # ProfilerStep#N ranges on the host
    gpu_steps: int  # ProfilerStep#N ranges on the GPU timeline (gpu_user_annotation)
    gpu_linked: int  # GPU events linked to their launching call (correlation)
    gpu_before_recording: int  # unlinked, with a correlation id below every call's
    # runtime calls whose correlation id another call of the same kind also has (a trace
    # written wrong: only the first links), and the GPU events behind those ids
    shared_id_calls: int
    shared_ids: int
    shared_id_gpu_events: int
    graph_kernels: int  # kernels launched by a CUDA graph replay
    graph_kernel_us: float
    kernel_us: float  # all kernel time, for the graph share

    @property
    def host_side(self) -> bool:
        """The trace holds the CPU side: operators or runtime calls."""
        return self.host_ops > 0 or self.runtime_calls > 0

    @property
    def ran_on_gpu(self) -> bool:
        """GPU activity, launch calls or counter ranges: the job used a GPU."""
        return self.gpu_events > 0 or self.launch_calls > 0 or self.counter_ranges > 0

    @property
    def gpu_unlinked_in_recording(self) -> int:
        """GPU events without a launching call that the recording should have held."""
        if self.runtime_calls == 0:
            return 0
        return self.gpu_events - self.gpu_linked - self.gpu_before_recording

    @property
    def graph_kernel_share_pct(self) -> float | None:
        if self.kernel_us <= 0:
            return None
        return 100.0 * self.graph_kernel_us / self.kernel_us

    def lacks(self) -> tuple[Lack, ...]:
        out: list[Lack] = []
        if not self.host_side and self.gpu_events:
            out.append(
                Lack(
                    "the CPU side (no operators or runtime calls: a GPU-only trace)",
                    "data wait, the host parts of the step breakdown (runtime, dataloader, "
                    "CPU exec, other), what the host did while the GPU idled, host syncs, "
                    "launch statistics and device time per operator are unknown",
                )
            )
        if self.ran_on_gpu and self.gpu_events == 0:
            what = (
                "a CUPTI range-profiler trace: counter ranges, no kernel timeline"
                if self.counter_ranges
                else "GPU activity was not recorded (no kernels, copies or memsets)"
            )
            out.append(
                Lack(
                    f"GPU activity ({what})",
                    "GPU busy and idle time, utilisation, kernels, copies and communication "
                    "are unknown",
                )
            )
        if self.host_steps == 0 and (self.host_side or self.gpu_events):
            window = (
                "the GPU-side ProfilerStep ranges"
                if self.gpu_steps
                else "first to last GPU activity"
                if self.gpu_events
                else "the host span"
            )
            out.append(
                Lack(
                    "ProfilerStep#N ranges on the host",
                    f"step times and per-step figures are for {window}, not for training steps",
                )
            )
        if self.graph_kernels:
            out.append(
                Lack(
                    f"an operator per kernel for the {self.graph_kernels} kernels replayed "
                    "from CUDA graphs",
                    "their device time is attributed to the operator around the graph "
                    "launch, not to the operators that were captured "
                    f"({_pct(self.graph_kernel_share_pct)} of kernel time)",
                )
            )
        return tuple(out)

    def to_dict(self) -> dict[str, object]:
        return {
            "host_ops": self.host_ops,
            "runtime_calls": self.runtime_calls,
            "gpu_events": self.gpu_events,
            "counter_ranges": self.counter_ranges,
            "host_steps": self.host_steps,
            "gpu_steps": self.gpu_steps,
            "gpu_linked": self.gpu_linked,
            "gpu_before_recording": self.gpu_before_recording,
            "gpu_unlinked_in_recording": self.gpu_unlinked_in_recording,
            "shared_id_calls": self.shared_id_calls,
            "shared_id_gpu_events": self.shared_id_gpu_events,
            "graph_kernels": self.graph_kernels,
            "graph_kernel_share_pct": self.graph_kernel_share_pct,
            "lacks": [{"part": lack.part, "figures": lack.figures} for lack in self.lacks()],
        }


def _pct(value: float | None) -> str:
    return f"{value:.1f} %" if value is not None else "unknown"


def trace_parts(events: pl.DataFrame, index: TraceIndex) -> TraceParts:
    name, cat = pl.col("name"), pl.col("cat")
    launches = pl.lit(False)
    for prefix in LAUNCH_CALL_PREFIXES:
        launches = launches | name.str.starts_with(prefix)
    counts = events.select(
        ((sel.CPU_OP | sel.ANNOTATION) & sel.DURATION).sum().alias("host_ops"),
        (cat == COUNTER_RANGE_CATEGORY).sum().alias("counter_ranges"),
        sel.STEP.sum().alias("host_steps"),
        sel.GPU_STEP.sum().alias("gpu_steps"),
    ).row(0, named=True)
    runtime = index.runtime
    gpu = index.gpu
    # counted in queries, not by filtering copies of the index's frames (the 1 GB trace's
    # kernels alone were a 190 MB copy)
    launch_calls = int(runtime.select(launches.sum()).item() or 0) if runtime.height else 0
    first_call = runtime["correlation"].min() if runtime.height else None
    unlinked = pl.col("rt_id").is_null()
    early = pl.col("correlation") < first_call if first_call is not None else pl.lit(False)
    gpu_counts = gpu.select(
        unlinked.sum().alias("unlinked"), (unlinked & early).sum().alias("before")
    ).row(0, named=True)
    ids = runtime.get_column("correlation").drop_nulls()
    shared = (
        runtime.filter(pl.col("correlation").is_not_null())
        .group_by("cat", "correlation")
        .len()
        .filter(pl.col("len") > 1)
        # grouping every call by its id (1.1 M of the 1 GB trace's, +190 MB) only where
        # some id is used twice
        if ids.n_unique() < ids.len()
        else None
    )
    shared_ids = shared["correlation"].unique() if shared is not None else None
    kernel = pl.col("cat") == "kernel"
    graph = kernel & pl.col("rt_name").is_in(sorted(GRAPH_LAUNCH_NAMES))
    kernel_counts = gpu.select(
        graph.sum().alias("graph_kernels"),
        pl.col("dur_us").filter(graph).sum().alias("graph_kernel_us"),
        pl.col("dur_us").filter(kernel).sum().alias("kernel_us"),
    ).row(0, named=True)
    return TraceParts(
        host_ops=int(counts["host_ops"] or 0),
        runtime_calls=runtime.height,
        launch_calls=launch_calls,
        gpu_events=gpu.height,
        counter_ranges=int(counts["counter_ranges"] or 0),
        host_steps=int(counts["host_steps"] or 0),
        gpu_steps=int(counts["gpu_steps"] or 0),
        gpu_linked=gpu.height - int(gpu_counts["unlinked"] or 0),
        gpu_before_recording=int(gpu_counts["before"] or 0),
        shared_id_calls=int(shared["len"].sum()) if shared is not None and shared.height else 0,
        shared_ids=shared_ids.len() if shared_ids is not None else 0,
        shared_id_gpu_events=(
            gpu.filter(pl.col("correlation").is_in(shared_ids.implode())).height
            if shared_ids is not None and shared_ids.len()
            else 0
        ),
        graph_kernels=int(kernel_counts["graph_kernels"] or 0),
        graph_kernel_us=float(kernel_counts["graph_kernel_us"] or 0.0),
        kernel_us=float(kernel_counts["kernel_us"] or 0.0),
    )
