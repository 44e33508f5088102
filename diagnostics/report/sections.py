"""The rows of a report's sections (source, environment, summary, config, ranks) and the
chart inputs the rules' evidence carries, read from an AnalysisResult. Plain text: the
renderers escape it."""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from diagnostics.dotted import flatten_dotted
from diagnostics.metrics import GPU_BUSY, GPU_KERNEL_UTILISATION, KeyMetrics, peak_memory_name
from diagnostics.report import fmt


def set_args(patch: Mapping[str, Any] | None) -> tuple[str, ...]:
    return tuple(f"{key}={fmt.config_literal(value)}" for key, value in (patch or {}).items())


# A script run's patch is in the keys `pipeline-doctor profile --override` takes
SCRIPT_PATCH_PREFIX = "dataloader."


def is_script_patch(patch: Mapping[str, Any] | None) -> bool:
    return bool(patch) and all(str(k).startswith(SCRIPT_PATCH_PREFIX) for k in patch or {})


def rerun_command(patch: Mapping[str, Any] | None, evidence: Mapping[str, Any]) -> str | None:
    """The command that re-runs with the patch: the trainer's ``--set`` for a trainer run,
    ``pipeline-doctor profile --override`` for a script run (the rule's own command, which
    names the script and its arguments, when it gave one)."""
    if not patch:
        return None
    if not is_script_patch(patch):
        return "python -m trainer run … " + " ".join(f"--set {a}" for a in set_args(patch))
    given = evidence.get("rerun_command")
    if isinstance(given, str) and given:
        return given
    overrides = " ".join(f"--override {a}" for a in set_args(patch))
    return f"pipeline-doctor profile {overrides} YOUR_SCRIPT.py …"


def script_rows(manifest: Any) -> list[tuple[str, str]]:
    """A script run's script, its hash and the command line that profiled it."""
    if getattr(manifest, "kind", "trainer") != "script":
        return []
    script = manifest.extra.get("script") or {}
    rows = []
    if script.get("path"):
        rows.append(("script", str(script["path"])))
    if script.get("args"):
        rows.append(("script arguments", shlex.join(str(a) for a in script["args"])))
    if script.get("sha256"):
        rows.append(("script sha256", str(script["sha256"])))
    command = manifest.extra.get("command")
    if isinstance(command, list) and command:
        rows.append(("command", shlex.join(str(a) for a in command)))
    return rows


def flat_config(config: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """(dotted key, value as the report prints it) for every setting, in stored order."""
    return [(key, fmt.config_literal(value)) for key, value in flatten_dotted(config).items()]


def gpu_name(result: Any) -> str | None:
    env = getattr(result, "environment", None) or {}
    if env.get("gpu_name"):
        return str(env["gpu_name"])
    facts = getattr(result, "facts", None)
    for props in getattr(facts, "device_properties", ()) or ():
        if props.get("name"):
            return str(props["name"])
    return None


def world_size(result: Any) -> int | None:
    facts = getattr(result, "facts", None)
    distributed = getattr(facts, "distributed", None) or {}
    size = distributed.get("world_size")
    return int(size) if isinstance(size, int | float) and size > 0 else None


def environment_rows(result: Any) -> list[tuple[str, str]]:
    env = dict(getattr(result, "environment", None) or {})
    facts = getattr(result, "facts", None)
    rows = [
        ("PyTorch", env.get("pytorch_version") or getattr(facts, "pytorch_version", None)),
        ("device", env.get("device") or getattr(facts, "device", None)),
        ("GPU", gpu_name(result)),
        ("GPU architecture", gpu_identity(env)),
        ("CPU cores", env.get("cpu_count")),
    ]
    world = world_size(result)
    if world:
        rows.append(("ranks in the job", world))
    shown = {
        "pytorch_version",
        "device",
        "gpu_name",
        "cpu_count",
        "gpu_vendor",
        "gpu_model",
        "gpu_architecture",
        "gpu_generation",
    }
    rows.extend((key.replace("_", " "), value) for key, value in env.items() if key not in shown)
    return [
        (label, fmt.evidence_value("", value))
        for label, value in rows
        if value is not None and value != ""
    ]


def source_rows(result: Any) -> list[tuple[str, str]]:
    source = dict(getattr(result, "source", None) or {})
    rows = [("kind", str(source.get("kind", "")))]
    if source.get("path"):
        rows.append(("path", str(source["path"])))
    files = source.get("files") or []
    if files:
        shown = ", ".join(Path(str(f)).name for f in list(files)[:8])
        more = f" and {len(files) - 8} more" if len(files) > 8 else ""
        rows.append(("files", shown + more))
    if source.get("ranks"):
        rows.append(fmt.ranks_row(source["ranks"]))
    run = getattr(result, "run", None)
    if run is not None:
        rows.append(("run id", str(run.manifest.run_id)))
        rows.extend(script_rows(run.manifest))
        rows.append(("status", str(run.status.status)))
        if run.status.reason:
            rows.append(("status reason", str(run.status.reason)))
        if run.manifest.parent_run_id:
            rows.append(("re-run of", str(run.manifest.parent_run_id)))
        if run.manifest.applied_patch:
            rows.append(("applied patch", ", ".join(set_args(run.manifest.applied_patch))))
    return rows


def summary_rows(metrics: KeyMetrics, summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    rows = [
        ("steps analysed", fmt.number(metrics.steps)),
        ("steady-state steps (the medians' steps)", fmt.number(metrics.steady_steps)),
        ("median step time", fmt.ms(metrics.median_step_time_ms)),
        ("mean step time", fmt.ms(metrics.mean_step_time_ms)),
        ("p95 step time", fmt.ms(metrics.p95_step_time_ms)),
        (
            "throughput",
            fmt.rate(metrics.samples_per_s, "samples/s")
            if metrics.samples_per_s is not None
            else fmt.rate(metrics.steps_per_s, "steps/s"),
        ),
        ("data-wait share of step time", fmt.pct(metrics.data_wait_pct)),
        (GPU_KERNEL_UTILISATION, fmt.pct(metrics.gpu_kernel_utilization_pct)),
        (GPU_BUSY, fmt.pct(metrics.gpu_busy_pct)),
        (
            f"peak memory, {peak_memory_name(metrics.peak_memory_kind, metrics.peak_memory_window)}",
            fmt.bytes_(metrics.peak_memory_bytes),
        ),
        *mfu_rows(summary),
    ]
    breakdown = summary.get("breakdown_pct") or {}
    if breakdown:
        parts = ", ".join(
            f"{name.replace('_', ' ')} {fmt.pct(value)}"
            for name, value in breakdown.items()
            if value is not None
        )
        # a mean over the profiled steps (each part's sum over the steps' summed time, as
        # torch-tb-profiler shows it): not the data-wait share above, which is a median
        rows.append(("trace time breakdown (mean over the profiled steps)", parts))
    idle = summary.get("gpu_idle_breakdown_pct") or {}
    if isinstance(idle, Mapping) and idle:
        parts = ", ".join(
            f"{name.replace('_', ' ')} {fmt.pct(value)}"
            for name, value in idle.items()
            if value is not None
        )
        rows.append(("GPU idle time by cause", parts))
    if summary.get("gpu_busy_us") is not None:
        rows.append(("GPU busy time (trace)", fmt.ms(float(summary["gpu_busy_us"]) / 1000.0)))
    timeline = summary.get("gpu_timeline")
    if isinstance(timeline, Mapping) and timeline.get("total_us"):
        rows.append(("GPU timeline, as TraceLens measures it", _timeline_text(timeline)))
    rows.extend(kernel_coverage_rows(summary))
    rows.extend(roofline_rows(summary))
    return rows


def gpu_identity(environment: Mapping[str, Any]) -> str | None:
    """'AMD MI300X (gfx942, CDNA 3)', 'NVIDIA H100 (sm_90, Hopper)'; None when unknown."""
    vendor = {"nvidia": "NVIDIA", "amd": "AMD"}.get(str(environment.get("gpu_vendor") or ""))
    head = " ".join(str(p) for p in (vendor, environment.get("gpu_model")) if p)
    detail = ", ".join(
        str(p)
        for p in (environment.get("gpu_architecture"), environment.get("gpu_generation"))
        if p
    )
    if not head and not detail:
        return None
    return f"{head or 'GPU'} ({detail})" if detail else head


def kernel_coverage_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What the kernel-family table and the operator links account for (summary
    ``kernel_coverage``): shares of kernel time by unit and by precision, the largest
    kernels it does not know. Empty without kernels."""
    coverage = summary.get("kernel_coverage")
    if not isinstance(coverage, Mapping):
        return []

    def shares(key: str) -> str:
        values = coverage.get(key) or {}
        return ", ".join(
            f"{name} {fmt.pct(value)}" for name, value in values.items() if value and value > 0
        )

    rows = [
        ("kernel time classified by name", fmt.pct(coverage.get("classified_pct"))),
        ("kernel time by unit", shares("by_unit_pct")),
        ("kernel time by precision", shares("by_precision_pct")),
        (
            "kernel time attributed to a CPU operator",
            fmt.pct(coverage.get("operator_attributed_pct"))
            if coverage.get("operator_attributed_pct") is not None
            else "unknown (no CPU operators in the trace)",
        ),
    ]
    parts = summary.get("trace_parts")
    graph_share = parts.get("graph_kernel_share_pct") if isinstance(parts, Mapping) else None
    if graph_share:
        rows.append(
            (
                "kernel time replayed from CUDA graphs",
                f"{fmt.pct(graph_share)}: attributed to the operator that launched each graph; "
                "the operators captured in it are not in the trace",
            )
        )
    unknown = coverage.get("unknown_kernels") or []
    if unknown:
        count = int(coverage.get("unknown_kernel_count") or len(unknown))
        listed = "; ".join(
            f"{str(k.get('name'))[:90]} ({fmt.ms(float(k.get('device_us') or 0) / 1000.0)})"
            for k in unknown[:5]
        )
        more = f" and {count - 5} more" if count > 5 else ""
        rows.append(("kernels the table does not know", listed + more))
    return rows


def _timeline_text(timeline: Mapping[str, Any]) -> str:
    window = (
        "GPU-side ProfilerStep window"
        if timeline.get("window") == "gpu_profiler_steps"
        else "first to last GPU activity"
    )

    def ms(key: str) -> str:
        value = timeline.get(key)
        return fmt.ms(float(value) / 1000.0) if value is not None else fmt.MISSING

    return (
        f"{window}: total {ms('total_us')}, computation {ms('computation_us')}, exposed "
        f"communication {ms('exposed_comm_us')}, exposed copies {ms('exposed_memcpy_us')}, "
        f"idle {ms('idle_us')} ({fmt.pct(timeline.get('idle_pct'))})"
    )


def ranks_table(
    summary: Mapping[str, Any],
) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]] | None:
    ranks = summary.get("ranks")
    table = ranks.get("table") if isinstance(ranks, Mapping) else None
    if not isinstance(table, list) or not table or not isinstance(table[0], Mapping):
        return None
    keys = list(table[0].keys())
    head = tuple(fmt.label(str(k)) for k in keys)
    rows = tuple(
        tuple(fmt.evidence_value(str(k), row.get(k)) for k in keys)
        for row in table
        if isinstance(row, Mapping)
    )
    return head, rows


POINT_SIGNALS = ("grad_spikes", "non_finite", "scaler_skipped_steps")


def spike_steps(findings: Iterable[Any]) -> list[int]:
    """Steps the unstable-gradients rule points at (its evidence "steps" lists them when a
    point signal fired; otherwise it holds a range, which is not a spike)."""
    for finding in findings:
        evidence = finding.evidence or {}
        if finding.rule != "unstable-gradients" or not any(k in evidence for k in POINT_SIGNALS):
            continue
        values = evidence.get("steps")
        if isinstance(values, list | tuple):
            return [int(v) for v in values if isinstance(v, int | float)]
    return []


def leak_slope(findings: Iterable[Any]) -> tuple[float | None, str]:
    """The memory-leak rule's slope and the step column it was fitted on."""
    for finding in findings:
        evidence = finding.evidence or {}
        slope = evidence.get("slope_bytes_per_step")
        if finding.rule == "memory-leak" and isinstance(slope, int | float):
            series = str(evidence.get("series", "")).lower()
            if "cuda" in series:
                return float(slope), "cuda_allocated_bytes"
            if "rss" in series:
                return float(slope), "rss_bytes"
    return None, "rss_bytes"


def _utilisation_text(figure: Mapping[str, Any], steps_word: str) -> str:
    steps = figure.get("steps") or []
    rate = figure.get("median_tflops_per_s")
    achieved = f"{rate:.1f} TFLOP/s" if isinstance(rate, int | float) else "rate unknown"
    if figure.get("median_pct") is None:
        reason = figure.get("unknown_reason") or "no dense peak for this device"
        return f"unknown: {reason} ({achieved}, median of {len(steps)} {steps_word})"
    text = (
        f"{fmt.pct(figure['median_pct'])} of the {figure.get('device_peak')} dense "
        f"{figure.get('precision')} peak, {fmt.number(figure.get('peak_tflops'))} TFLOP/s "
        f"({achieved}, median of {len(steps)} {steps_word}"
    )
    per_token = figure.get("flops_per_token")
    if isinstance(per_token, Mapping) and per_token:
        text += "; FLOPs per token " + ", ".join(
            f"{phase} {fmt.number(value)}" for phase, value in per_token.items()
        )
    covered = figure.get("gpu_time_covered_pct")
    if covered is not None:
        text += f"; the counted operators ran {fmt.pct(covered)} of the GPU busy time"
    return text + ")"


def mfu_rows(summary: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The two FLOPs utilisations (summary ``mfu``, diagnostics/facts/mfu.py), each labelled
    with what it is; empty when neither applies (a CPU run)."""
    mfu = summary.get("mfu")
    if not isinstance(mfu, Mapping):
        return []
    rows = []
    for key, steps_word in (("model", "steady-state steps"), ("counted", "profiler steps")):
        figure = mfu.get(key)
        if isinstance(figure, Mapping):
            rows.append((str(figure.get("label")), _utilisation_text(figure, steps_word)))
    return rows


def roofline_rows(summary: Mapping[str, Any], top: int = 3) -> list[tuple[str, str]]:
    """The roofline (summary ``roofline``, docs/ROOFLINE.md): the device's dense peak, the
    FLOPs counted from the recorded shapes, and the largest operator signatures' rates.
    Empty without modelled operators."""
    roofline = summary.get("roofline")
    if not isinstance(roofline, Mapping):
        return []
    peak = roofline.get("device_peak")
    rows = [
        (
            "device peak (dense)",
            f"{peak['device']}: bf16 {fmt.number(peak.get('bf16_tflops'))} TFLOP/s, "
            f"HBM {peak['hbm_tbps']} TB/s ({peak['source']})"
            if isinstance(peak, Mapping)
            else "unknown device: no % of peak, no bound",
        )
    ]
    gpu_us = roofline.get("counted_gpu_us")
    rows.append(
        (
            "FLOPs counted from the recorded shapes",
            f"{fmt.number(roofline.get('counted_gflops'))} GFLOP"
            + (f" in {fmt.ms(float(gpu_us) / 1000.0)} of their GPU time" if gpu_us else ""),
        )
    )
    for row in (roofline.get("signatures") or [])[:top]:
        rate = row.get("tflops_per_s")
        pct = row.get("pct_of_peak_flops")
        text = f"{rate:.1f} TFLOP/s" if rate is not None else "no GPU time"
        if pct is not None:
            text += f", {fmt.pct(pct)} of peak"
        if row.get("bound"):
            text += f", {row['bound']}-bound"
        rows.append((f"roofline: {row.get('name')} {row.get('shape')}", text))
    return rows
