"""The drill-down tabs (Overview, Operators, Kernels, Memory, Timeline, Export) of one
analysed input; shared by Run detail and Upload. Tables and figures come from
diagnostics.drilldown and diagnostics.report.drill_plots; this module only lays them out.

The tabs run as a fragment: choosing a step or typing a search redraws them alone, not
the findings and charts above.
"""

from __future__ import annotations

from collections.abc import Sequence

import streamlit as st

from app_ui.render import PLOTLY_CONFIG
from app_ui.safe_text import md_text
from diagnostics.drilldown import PERFETTO_STEPS, DrillDown, search
from diagnostics.drilldown.kernels import no_kernels_text
from diagnostics.errors import InputError
from diagnostics.report import drill_plots

TABS = ("Overview", "Operators", "Kernels", "Memory", "Timeline", "Export")
MS = st.column_config.NumberColumn
# The roofline figures both tables carry (diagnostics.facts.roofline)
ROOFLINE_COLUMNS = {
    "tflops_per_s": MS("TFLOP/s", format="%.1f", help="FLOPs over the union of its GPU time"),
    "tb_per_s": MS("TB/s", format="%.3f", help="compulsory bytes over its GPU time"),
    "flops_per_byte": MS("FLOP/byte", format="%.1f", help="arithmetic intensity"),
    "pct_of_peak_flops": MS(
        "% of peak", format="%.1f", help="of the device's dense peak; empty: device unknown"
    ),
    "bound": st.column_config.TextColumn("Bound", help="compute or memory (the roofline)"),
}
OPERATOR_COLUMNS = {
    "operator": st.column_config.TextColumn("Operator", width="large"),
    "input_shapes": st.column_config.TextColumn("Input shapes", width="medium"),
    "calls": st.column_config.NumberColumn("Calls", format="%d"),
    "host_self_ms": MS("Host self (ms)", format="%.3f"),
    "host_total_ms": MS("Host total (ms)", format="%.3f"),
    "device_self_ms": MS("Device self (ms)", format="%.3f"),
    "device_total_ms": MS("Device total (ms)", format="%.3f"),
    "tensor_core_eligible": st.column_config.CheckboxColumn("Tensor Core eligible"),
    "gflops": MS("GFLOP", format="%.3f", help="FLOPs of all calls (docs/ROOFLINE.md)"),
    **ROOFLINE_COLUMNS,
}
KERNEL_COLUMNS = {
    "kernel": st.column_config.TextColumn("Kernel", width="large"),
    "calls": st.column_config.NumberColumn("Calls", format="%d"),
    "total_us": MS("Total (µs)", format="%.1f"),
    "mean_us": MS("Mean (µs)", format="%.2f"),
    "min_us": MS("Min (µs)", format="%.2f"),
    "max_us": MS("Max (µs)", format="%.2f"),
    "blocks_per_sm": MS("Blocks per SM", format="%.2f"),
    "occupancy_pct": MS("Est. occupancy (%)", format="%.1f"),
    "tensor_core": st.column_config.CheckboxColumn("Tensor / Matrix Cores"),
    "operator": st.column_config.TextColumn("Launched by", width="medium"),
    "operators": st.column_config.NumberColumn("Operators", format="%d"),
    **ROOFLINE_COLUMNS,
}


def drilldown(drills: Sequence[DrillDown], key_prefix: str) -> None:
    """The tabs for one of ``drills`` (a choice of rank or file when there are several)."""
    if not drills:
        st.caption("No profiler trace: nothing to drill into.")
        return
    st.fragment(_body)(drills, key_prefix)


def _body(drills: Sequence[DrillDown], key_prefix: str) -> None:
    drill = drills[0]
    if len(drills) > 1:
        labels = [d.label for d in drills]
        chosen = st.selectbox("Trace", labels, key=f"{key_prefix}-drill-trace")
        drill = drills[labels.index(chosen)]
    overview, operators, kernels, memory, timeline, export = st.tabs(TABS)
    with overview:
        _overview(drill, key_prefix)
    with operators:
        _operators(drill, key_prefix)
    with kernels:
        _kernels(drill, key_prefix)
    with memory:
        _memory(drill, key_prefix)
    with timeline:
        # its own fragment: another step redraws the timeline alone, not the other tabs
        st.fragment(_timeline)(drill, key_prefix)
    with export:
        st.fragment(_export)(drill, key_prefix)


def _timeline(drill: DrillDown, key_prefix: str) -> None:
    step = _step_choice(drill, key_prefix, "timeline")
    if step is None:
        return
    try:  # an upload's steps are read from its step folder, which may have been pruned
        timeline = drill.timeline(step)
    except InputError as exc:
        st.error(md_text(str(exc)), icon=":material/error:")
        return
    figure = drill_plots.timeline_figure(timeline)
    st.plotly_chart(figure, config=PLOTLY_CONFIG, key=f"{key_prefix}-timeline")
    gpu = bool(drill.trace.metadata.device_properties)  # Kineto writes them only with CUDA
    st.caption(
        "Events closer than a pixel are drawn as one bar (hover for how many and the "
        "longest); "
        + (
            "thin orange: CUDA runtime calls inside operators; red: the GPU ran nothing. "
            if gpu
            else "a CPU run: host threads only, no GPU lanes. "
        )
        + "Zoom with a drag, reset with a double click."
    )


def _overview(drill: DrillDown, key_prefix: str) -> None:
    left, right = st.columns([2, 3])
    with left:
        st.plotly_chart(
            drill_plots.overview_figure(drill.overview),
            config=PLOTLY_CONFIG,
            key=f"{key_prefix}-overview-donut",
        )
        st.dataframe(
            drill.overview,
            hide_index=True,
            width="stretch",
            column_config={
                "category": "Category",
                "mean_ms": MS("Mean per step (ms)", format="%.2f"),
                "pct": MS("Share (%)", format="%.1f"),
            },
        )
    with right:
        st.plotly_chart(
            drill_plots.steps_figure(drill.breakdown),
            config=PLOTLY_CONFIG,
            key=f"{key_prefix}-overview-steps",
        )


def _operators(drill: DrillDown, key_prefix: str) -> None:
    text, group = st.columns([3, 2])
    query = text.text_input("Search operators", key=f"{key_prefix}-op-search")
    by_shape = group.radio(
        "Group by",
        ["operator", "operator + input shapes"],
        horizontal=True,
        key=f"{key_prefix}-op-group",
        disabled=not drill.has_shapes,
        help=None if drill.has_shapes else "The trace has no shapes (record_shapes=False).",
    )
    table = drill.operators_by_shape if by_shape.startswith("operator +") else drill.operators
    if not by_shape.startswith("operator +"):
        table = table.drop("input_shapes")
    shown = search(table, query)
    st.caption(f"{shown.height} of {table.height} rows · click a header to sort")
    st.dataframe(
        shown, hide_index=True, width="stretch", column_config=OPERATOR_COLUMNS, height=420
    )


def _kernels(drill: DrillDown, key_prefix: str) -> None:
    if drill.kernels.height == 0:
        st.info(no_kernels_text(drill.trace.metadata.device_properties), icon=":material/memory:")
        return
    query = st.text_input("Search kernels", key=f"{key_prefix}-kernel-search")
    shown = search(drill.kernels, query, column="kernel")
    if drill.kernels.height and drill.kernels["occupancy_pct"].null_count() == drill.kernels.height:
        st.caption(
            "This trace has no blocks per SM or occupancy figures (CUPTI did not write them)."
        )
    st.caption(f"{shown.height} of {drill.kernels.height} kernels · click a header to sort")
    st.dataframe(shown, hide_index=True, width="stretch", column_config=KERNEL_COLUMNS, height=420)


def _memory(drill: DrillDown, key_prefix: str) -> None:
    st.plotly_chart(
        drill_plots.memory_curve_figure(drill.memory_curve, drill.memory_peaks),
        config=PLOTLY_CONFIG,
        key=f"{key_prefix}-memory-curve",
    )
    if drill.allocations.height:
        st.markdown("**Largest allocations**")
        st.dataframe(
            drill.allocations,
            hide_index=True,
            width="stretch",
            column_config={
                "size_mib": MS("Size (MiB)", format="%.2f"),
                "time_ms": MS("At (ms)", format="%.1f"),
                "device": st.column_config.NumberColumn("Device (-1 host)", format="%d"),
                "operator": st.column_config.TextColumn("Operator", width="large"),
                "allocated_after_mib": MS("Allocated after (MiB)", format="%.1f"),
            },
        )


def _step_choice(drill: DrillDown, key_prefix: str, what: str) -> int | None:
    steps = drill.step_ids
    if not steps:
        st.caption("The trace has no profiler steps.")
        return None
    return st.selectbox(
        "Profiler step",
        steps,
        index=len(steps) // 2,
        key=f"{key_prefix}-{what}-step",
    )


def _export(drill: DrillDown, key_prefix: str) -> None:
    st.markdown("\n".join(f"{i}. {line}" for i, line in enumerate(PERFETTO_STEPS, start=1)))
    step = _step_choice(drill, key_prefix, "export")
    if step is None:
        return
    st.download_button(
        f"Download step {step} as a Chrome trace (.json)",
        data=lambda: drill.step_export(step),
        file_name=f"step-{step}.trace.json",
        mime="application/json",
        icon=":material/download:",
        on_click="ignore",
        key=f"{key_prefix}-export-download",
    )
