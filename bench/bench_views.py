"""Draw time of each drill-down view on the large shared trace (~54 MB decompressed).

"Draw time" is what the server does for a view: build its table or figure from the loaded
trace and serialise it as Streamlit sends it to the browser (plotly's to_json, as
st.plotly_chart does; Arrow for tables). The output column is the bytes sent. The loading itself (shared by every view) is timed on its
own line. Target (issue 11): a step's timeline under 2 s.

    .venv/bin/python bench/bench_views.py [trace] [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from diagnostics.drilldown import build_drilldown  # noqa: E402
from diagnostics.report import drill_plots, plots  # noqa: E402
from diagnostics.trace.loader import load  # noqa: E402

DEFAULT_TRACE = REPO.parent / "shared" / "traces" / "hta_v100_rank1_of_2_large.json.gz"
TARGET_S = 2.0


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, object]:
    times, value = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace", nargs="?", default=str(DEFAULT_TRACE))
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    path = Path(args.trace)
    load_s, loaded = timed(lambda: load(path), 1)
    trace = loaded.traces[0]
    build_s, drill = timed(lambda: build_drilldown(trace), args.repeats)
    step = drill.step_ids[len(drill.step_ids) // 2]

    def timeline() -> int:
        return len(drill_plots.timeline_figure(drill.timeline(step)).to_json())

    views: list[tuple[str, Callable[[], object]]] = [
        (
            "Overview (donut + per-step bars)",
            lambda: (
                len(drill_plots.overview_figure(drill.overview).to_json())
                + len(plots.breakdown_figure(drill.breakdown).to_json())
            ),
        ),
        # tables: serialised to Arrow as st.dataframe sends them (bytes)
        ("Operators (table by operator+shape)", lambda: drill.operators_by_shape.to_arrow().nbytes),
        ("Kernels (table)", lambda: drill.kernels.to_arrow().nbytes),
        (
            "Memory (curve + allocations)",
            lambda: len(
                drill_plots.memory_curve_figure(drill.memory_curve, drill.memory_peaks).to_json()
            ),
        ),
        (f"Timeline (step {step}: compute + figure JSON)", timeline),
        (f"Export (step {step} Chrome-trace JSON)", lambda: len(drill.step_export(step))),
    ]
    size_mb = path.stat().st_size / 1e6
    print(f"trace: {path.name} ({size_mb:.1f} MB on disk), {trace.events.height:,} events")
    print(f"| view | median of {args.repeats} (s) | output |")
    print("|---|---:|---:|")
    print(f"| load (shared by all views) | {load_s:.3f} | {trace.events.height:,} events |")
    print(f"| build every table (once per trace) | {build_s:.3f} | |")
    for name, fn in views:
        seconds, value = timed(fn, args.repeats)
        print(f"| {name} | {seconds:.3f} | {value:,} |")
    timeline_s, _ = timed(timeline, args.repeats)
    tl = drill.timeline(step)
    verdict = "within" if timeline_s < TARGET_S else "OVER"
    print(
        f"\ntimeline: {tl.events:,} events -> {tl.segments.height:,} segments "
        f"(tolerance {tl.tolerance_us:.0f} µs), {timeline_s:.3f} s: {verdict} the {TARGET_S:g} s target"
    )


if __name__ == "__main__":
    main()
