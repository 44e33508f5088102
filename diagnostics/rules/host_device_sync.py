"""host-device-sync: the host blocks on the GPU inside the training step.

What it finds
    Synchronisation calls inside the profiled steps (``cudaStreamSynchronize``,
    ``cudaDeviceSynchronize``, ``aten::item``, ``aten::_local_scalar_dense``, copies to
    pageable host memory) that leave the GPU idle: the GPU idle time during which the host
    sat in a sync (the analyser's gap attribution), as a share of step time, above a
    threshold. A host that blocks while the GPU is still busy with queued work loses
    nothing, so blocked time alone does not fire (it is reported); without gap attribution
    the blocked share is used. The calls are listed by name with the time per step, and,
    when the trace was recorded with ``with_stack=True``, by where the user's code made
    them: ``sync_sites``, the innermost user frame around each blocked stretch (library,
    standard-library and torch frames skipped), top 5 by blocked time, with the path as
    recorded, its line and function. The line is the one Kineto records for the frame: the
    function's first line (the line of the call inside it is not in the trace). Without
    Python stacks ``sync_sites`` is null and the finding says so; no line is guessed.

Why it matters
    A sync empties the GPU's queue: the host waits for every launched kernel, and the GPU
    then waits for the host to launch the next ones. A ``loss.item()`` for logging every step
    costs one such bubble per step.

How to fix
    Read scalars back every N steps (or accumulate on the device and read once), avoid
    ``.cpu()``/``.numpy()``/``print(tensor)`` and data-dependent Python control flow in the
    step, and find the culprits with ``torch.cuda.set_sync_debug_mode("warn")``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import polars as pl

from diagnostics.model import AnalysisInputs
from diagnostics.percent import pct
from diagnostics.rules import examples as ex
from diagnostics.rules.base import (
    Example,
    Finding,
    Fix,
    Rule,
    Severity,
    need_cuda_trace,
    need_trace_host_side,
)
from diagnostics.rules.evidence import chart, cuda_trace, r, step_range
from diagnostics.thresholds import Thresholds

FIX_CODE = """\
# before: a host-device sync in every step
for step, batch in enumerate(loader):
    loss = train_step(batch)
    losses.append(loss.item())          # blocks until the GPU finishes

# after: keep the value on the device, read it back rarely
running = torch.zeros((), device="cuda")
for step, batch in enumerate(loader):
    loss = train_step(batch)
    running += loss.detach()
    if step % 100 == 0:
        print(running.item() / 100)     # one sync per 100 steps
        running.zero_()
# to find hidden syncs: torch.cuda.set_sync_debug_mode("warn")
"""


TOP_SITES = 5
NO_STACKS_NOTE = (
    "the trace has no Python stacks, so the lines that sync are unknown: "
    "record with torch.profiler.profile(with_stack=True)"
)


def short_path(path: str) -> str:
    """The last two components of a recorded path, for display (evidence keeps it whole)."""
    return "/".join(path.replace("\\", "/").split("/")[-2:])


def site_rows(sites: pl.DataFrame | None) -> list[dict[str, Any]] | None:
    """The top sites by blocked time as evidence rows; None when the trace has no stacks."""
    if sites is None:
        return None
    named = sites.filter(pl.col("file").is_not_null()).head(TOP_SITES)
    return [
        {
            "site": f"{short_path(row['file'])}:{row['line']}",
            "function": row["function"],
            "file": row["file"],
            "line": row["line"],
            "frame": row["frame"],
            "op": row["op"],
            "calls_per_step": r(row["calls_per_step"], 1),
            "blocked_ms_per_step": r(row["blocked_us_per_step"] / 1000.0, 3),
        }
        for row in named.iter_rows(named=True)
    ]


def site_phrase(site: dict[str, Any]) -> str:
    """``aten::item in train_step (train.py:37)``: the op, the function and where it starts."""
    return f"{site['op']} in {site['function']} ({site['site']})"


def fix_code(site: dict[str, Any] | None) -> str:
    if site is None:
        return FIX_CODE
    where = (
        f"# the trace's stacks: {site_phrase(site)}, {site['calls_per_step']} call(s) and "
        f"{site['blocked_ms_per_step']} ms blocked per step\n"
        f"# ({site['file']} line {site['line']} is where {site['function']} starts as the "
        "trace records it; look inside it for the read-back)\n"
    )
    return where + FIX_CODE


class HostDeviceSync(Rule):
    id = "host-device-sync"
    title = "The host waits for the GPU inside the step"
    severity = Severity.MEDIUM
    needs = (
        need_cuda_trace("synchronisation calls are only visible in a GPU profile"),
        need_trace_host_side("the host's synchronisation calls"),
    )
    threshold_names = ("sync_share_min_pct",)

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        trace = cuda_trace(inputs)
        assert trace is not None
        per_step = trace.sync_per_step
        if per_step.height == 0 or trace.steps.height == 0:
            return []
        joined = trace.steps.select("step", "dur_us").join(per_step, on="step", how="left")
        joined = joined.with_columns(pl.col("sync_us").fill_null(0.0))
        sync_us = float(joined["sync_us"].sum())
        step_us = float(joined["dur_us"].sum())
        blocked_pct = 100.0 * sync_us / step_us if step_us > 0 else 0.0
        idle_sync_us = 0.0
        if trace.idle_gaps.height:
            idle_sync_us = float(
                trace.idle_gaps.filter(pl.col("host_activity") == "sync")["dur_us"].sum()
            )
            share = 100.0 * idle_sync_us / step_us if step_us > 0 else 0.0
            measure = "GPU idle while the host was in a sync, share of step time"
        else:
            share = blocked_pct
            measure = "host time blocked in sync calls, share of step time (no gap attribution)"
        if share < thresholds.sync_share_min_pct:
            return []
        # the GPU idles during the bubble a sync creates; removing the sync removes that idle
        saving = 100.0 * idle_sync_us / step_us if step_us > 0 and idle_sync_us else None
        top = trace.syncs.sort("total_us", descending=True).head(8) if trace.syncs.height else None
        calls = (
            [
                {"name": row["name"], "count": row["count"], "total_us": r(row["total_us"], 0)}
                for row in top.iter_rows(named=True)
            ]
            if top is not None
            else []
        )
        sites = site_rows(trace.sync_sites)
        top_site = sites[0] if sites else None
        evidence: dict[str, Any] = {
            "source": "trace: synchronisation calls inside profiler steps",
            "sync_share_pct": r(share, 1),
            "measure": measure,
            "host_blocked_pct": r(blocked_pct, 1),
            "sync_us_per_step": r(sync_us / joined.height, 0),
            "sync_calls_per_step": r(float(joined["sync_count"].fill_null(0).mean()), 1),
            "gpu_idle_during_sync_us": r(idle_sync_us, 0),
            "calls": calls,
            "sync_sites": sites,
            "threshold_pct": thresholds.sync_share_min_pct,
            "steps": step_range(joined["step"]),
            "chart": chart(
                "bar",
                "Time blocked in host-device synchronisation per step",
                "step",
                "time (ms)",
                joined["step"].to_list(),
                {
                    "sync (ms)": (joined["sync_us"] / 1000.0).round(3).to_list(),
                    "step (ms)": (joined["dur_us"] / 1000.0).round(3).to_list(),
                },
            ),
        }
        if sites is None:
            evidence["sync_sites_note"] = NO_STACKS_NOTE
        worst = calls[0]["name"] if calls else "synchronisation calls"
        if top_site is not None:
            worst = site_phrase(top_site)
            where = f", mostly {worst}"
        else:
            where = ""
        stacks_hint = f" ({NO_STACKS_NOTE})" if sites is None else ""
        return [
            Finding(
                rule=self.id,
                severity=Severity.HIGH
                if share >= 4 * thresholds.sync_share_min_pct
                else self.severity,
                title=f"Host-device syncs leave the GPU idle {pct(share)} of step time{where}",
                evidence=evidence,
                recommendation=(
                    f"The host blocks {sync_us / joined.height / 1000:.2f} ms per step waiting for "
                    f"the GPU, mostly {'' if top_site else 'in '}{worst}, and the GPU sits idle "
                    f"{idle_sync_us / joined.height / 1000:.2f} ms per step meanwhile. Move .item()/.cpu() reads out of the step or "
                    "do them every N steps; run once with torch.cuda.set_sync_debug_mode('warn') "
                    f"to find each one{stacks_hint}."
                ),
                fix=Fix(code=fix_code(top_site), config_patch=None),
                estimated_saving_pct=r(saving, 1) if saving is not None else None,
            )
        ]

    examples: ClassVar = (
        Example(
            "trace with Python stacks: aten::item in train_step (train.py:37) blocks each step",
            True,
            lambda: _synced(
                2000.0,
                idle_us=5000.0,
                idle_kind="host_wait",
                host_activity="sync",
                sync_sites=[
                    {
                        "frame": "train.py(37): train_step",
                        "file": "train.py",
                        "line": 37,
                        "function": "train_step",
                        "op": "aten::item",
                        "calls": 5,
                        "blocked_us": 10_000.0,
                        "calls_per_step": 1.0,
                        "blocked_us_per_step": 2000.0,
                    }
                ],
            ),
        ),
        Example(
            "trace: 2 ms of each 10 ms step in cudaStreamSynchronize",
            True,
            lambda: _synced(2000.0, idle_us=5000.0, idle_kind="host_wait", host_activity="sync"),
        ),
        Example(
            "trace: host blocked 2 ms per step but the GPU stays busy (no idle during syncs)",
            False,
            lambda: _synced(
                2000.0, idle_us=100.0, idle_kind="kernel_wait", host_activity="cpu_ops"
            ),
        ),
        Example(
            "trace: 50 µs of sync per 10 ms step",
            False,
            lambda: ex.inputs(
                trace=ex.trace(
                    sync_per_step={
                        "step": [1, 2, 3, 4, 5],
                        "sync_us": [50.0] * 5,
                        "sync_count": [1] * 5,
                    },
                    syncs=[{"name": "aten::item", "count": 5, "total_us": 250.0}],
                )
            ),
        ),
    )


def _synced(
    sync_us: float,
    *,
    idle_us: float,
    idle_kind: str,
    host_activity: str,
    sync_sites: list[dict[str, Any]] | None = None,
) -> Any:
    """5 steps each blocking ``sync_us`` in 3 cudaStreamSynchronize calls, and one idle gap
    on the GPU of ``idle_us`` of the given kind and host activity (examples); ``sync_sites``
    from the trace's Python stacks, None for a trace without them."""
    return ex.inputs(
        trace=ex.trace(
            sync_sites=sync_sites,
            sync_per_step={
                "step": [1, 2, 3, 4, 5],
                "sync_us": [sync_us] * 5,
                "sync_count": [3] * 5,
            },
            syncs=[{"name": "cudaStreamSynchronize", "count": 15, "total_us": 10_000.0}],
            idle_gaps=[
                {
                    "device": 0,
                    "stream": 7,
                    "start_us": 0.0,
                    "end_us": idle_us,
                    "dur_us": idle_us,
                    "idle_kind": idle_kind,
                    "host_activity": host_activity,
                }
            ],
        )
    )
