"""missing-pin-memory: batches are copied to the GPU from pageable host memory.

What it finds
    Host-to-device copies whose source is pageable memory (the trace names them
    ``Memcpy HtoD (Pageable -> Device)``), with their bytes and copy time per step; or a run
    on CUDA whose DataLoader has ``pin_memory=False`` (config), with the measured per-step
    host-to-device copy time. Device-to-host and device-to-device copies never count, and a
    CPU-only run is skipped: there is no host-to-device copy to pin.

Why it matters
    The driver first stages a pageable buffer into a pinned one, so the copy is synchronous
    with the host and slower; ``non_blocking=True`` cannot overlap it with compute. Pinned
    copies reach about twice the bandwidth over PCIe (NVIDIA, "How to Optimize Data
    Transfers in CUDA C/C++") and run asynchronously.

How to fix
    ``DataLoader(..., pin_memory=True)`` and ``batch.to(device, non_blocking=True)``. On a
    script run (``pipeline-doctor profile``) the finding names the line that built the
    DataLoader with its actual arguments, rewrites that call, and gives the patch as the
    ``--override`` key ``dataloader.pin_memory``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import polars as pl

from diagnostics.model import AnalysisInputs
from diagnostics.rules import examples as ex
from diagnostics.rules import script_loaders
from diagnostics.rules.base import Example, Finding, Fix, Need, Rule, Severity, on_cuda
from diagnostics.rules.evidence import (
    chart,
    config_value,
    cuda_trace,
    has_steps,
    numeric,
    r,
    run_device,
)
from diagnostics.rules.stats import median
from diagnostics.thresholds import Thresholds

# Pinned host-to-device copies run at about twice the pageable bandwidth (NVIDIA's data
# transfer guide), so pinning saves about half of the pageable copy time.
PINNED_SPEEDUP = 2.0

FIX_CODE = """\
# before: batches are staged through pageable memory, the copy blocks the host
loader = DataLoader(dataset, batch_size=32, num_workers=4)
batch = {k: v.to("cuda") for k, v in batch.items()}

# after: page-locked batches, copied asynchronously
loader = DataLoader(dataset, batch_size=32, num_workers=4, pin_memory=True)
batch = {k: v.to("cuda", non_blocking=True) for k, v in batch.items()}
"""
PATCH = {"data.pin_memory": True, "data.non_blocking": True}


def _pin_memory(run: Any) -> bool | None:
    """Whether the loader pins: a script run's own DataLoader, else the trainer config."""
    if script_loaders.is_script_run(run):
        loader = script_loaders.training_loader(run)
        return loader.pin_memory if loader is not None else None
    return config_value(run, "data.pin_memory")


def _for_script(inputs: AnalysisInputs, finding: Finding) -> Finding:
    """On a script run: the DataLoader's own line and arguments, and the fix against it."""
    loader = script_loaders.training_loader(inputs.run)
    if not script_loaders.is_script_run(inputs.run) or loader is None or loader.pin_memory:
        return finding
    return replace(
        finding,
        recommendation=f"{script_loaders.built_with(loader)}. {finding.recommendation}",
        fix=Fix(
            code=script_loaders.fix_code(
                loader,
                {"pin_memory": True},
                "page-locked batches, then .to(device, non_blocking=True)",
            ),
            config_patch=script_loaders.config_patch({"pin_memory": True}),
        ),
        evidence={
            **finding.evidence,
            "dataloader": {
                "site": loader.site,
                "code": loader.code,
                "built_by": loader.built_by,
                **{name: getattr(loader, name) for name in loader.ARGUMENTS},
            },
            "rerun_command": script_loaders.rerun_command(inputs.run, {"pin_memory": True}),
        },
    )


class MissingPinMemory(Rule):
    id = "missing-pin-memory"
    title = "Host-to-device copies come from pageable memory"
    severity = Severity.MEDIUM
    needs = (
        Need(
            "a CUDA trace or a CUDA run",
            on_cuda,
            lambda inputs: (
                "the run trained on CPU: there is no host-to-device copy to pin"
                if inputs.run is not None and run_device(inputs.run) == "cpu"
                else "no CUDA activity: pinned memory only matters for host-to-device copies"
            ),
        ),
    )
    threshold_names = ("pageable_h2d_min_bytes",)

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        return [_for_script(inputs, f) for f in self._check(inputs, thresholds)]

    def _check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        trace = cuda_trace(inputs)
        if trace is not None and trace.copies.height:
            finding = self._from_trace(inputs, thresholds)
            if finding is not None:
                return [finding]
            # the trace shows pinned or no HtoD copies: that outweighs the config
            htod = trace.copies.filter(pl.col("direction") == "HtoD")
            if htod.height:
                return []
        if inputs.run is not None and run_device(inputs.run) == "cuda":
            finding = self._from_run(inputs)
            return [finding] if finding is not None else []
        return []

    def _from_trace(self, inputs: AnalysisInputs, thresholds: Thresholds) -> Finding | None:
        trace = inputs.trace
        assert trace is not None
        htod = trace.copies.filter(pl.col("direction") == "HtoD")
        pageable = htod.filter(pl.col("src_memory") == "Pageable")
        if pageable.height == 0:
            return None
        total_bytes = int(pageable["bytes"].sum() or 0)
        if total_bytes < thresholds.pageable_h2d_min_bytes:
            return None
        copy_us = float(pageable["dur_us"].sum() or 0.0)
        count = int(pageable["count"].sum() or 0)
        steps = max(trace.steps.height, 1)
        step_us = float(trace.steps["dur_us"].sum() or 0.0) / steps if trace.steps.height else 0.0
        per_step_us = copy_us / steps
        saving = 100.0 * per_step_us * (1 - 1 / PINNED_SPEEDUP) / step_us if step_us > 0 else None
        pinned = htod.filter(pl.col("src_memory") == "Pinned")
        evidence: dict[str, Any] = {
            "source": "trace copies (Memcpy HtoD Pageable -> Device)",
            "pageable_htod_copies": count,
            "pageable_htod_bytes": total_bytes,
            "pageable_htod_bytes_per_step": total_bytes // steps,
            "pageable_htod_us_per_step": r(per_step_us, 1),
            "step_us_mean": r(step_us, 1),
            "pageable_bandwidth_gb_s": r(total_bytes / copy_us / 1e3, 2) if copy_us else None,
            "pinned_bandwidth_gb_s": (
                r(float(pinned["bytes"].sum()) / float(pinned["dur_us"].sum()) / 1e3, 2)
                if pinned.height and float(pinned["dur_us"].sum() or 0) > 0
                else None
            ),
            "steps": [trace.steps["step"].min(), trace.steps["step"].max()]
            if trace.steps.height
            else None,
            "chart": chart(
                "bar",
                "Host-to-device copies by source memory",
                "source memory",
                "copy time over the profiled steps (ms)",
                htod["src_memory"].to_list(),
                # time only: bytes (in the table) on the same axis would dwarf it
                {"copy time (ms)": [r(us / 1000.0, 3) for us in htod["dur_us"].to_list()]},
                highlight_x=["Pageable"],
            ),
        }
        return Finding(
            rule=self.id,
            severity=self.severity,
            title=f"{count} host-to-device copies ({total_bytes / 2**20:.1f} MiB) from pageable "
            "memory",
            evidence=evidence,
            recommendation=(
                f"Each step copies {total_bytes / steps / 2**20:.1f} MiB from pageable memory in "
                f"{per_step_us / 1000:.2f} ms, blocking the host. Pin the DataLoader's batches "
                "(pin_memory=True) and copy with non_blocking=True so copies overlap compute."
            ),
            fix=Fix(code=FIX_CODE, config_patch=dict(PATCH)),
            estimated_saving_pct=r(saving, 1) if saving is not None else None,
        )

    def _from_run(self, inputs: AnalysisInputs) -> Finding | None:
        run = inputs.run
        assert run is not None
        if _pin_memory(run) is not False:
            return None
        h2d = median(numeric(run.steps, "h2d_ms")) if has_steps(run, "h2d_ms") else None
        step = (
            median(numeric(run.steps, "step_time_ms")) if has_steps(run, "step_time_ms") else None
        )
        saving = 100.0 * h2d * (1 - 1 / PINNED_SPEEDUP) / step if h2d is not None and step else None
        steps = run.steps["step"].to_list()
        evidence: dict[str, Any] = {
            "source": "run config (data.pin_memory = false) and per-step h2d_ms",
            "pin_memory": False,
            "non_blocking": config_value(run, "data.non_blocking"),
            "h2d_ms_median": r(h2d),
            "step_time_ms_median": r(step),
            "steps": [steps[0], steps[-1]] if steps else None,
            "chart": chart(
                "line",
                "Host-to-device copy time per step",
                "step",
                "time (ms)",
                steps,
                {"h2d (ms)": numeric(run.steps, "h2d_ms")},
            )
            if steps
            else None,
        }
        h2d_text = f" the batch copy takes {h2d:.2f} ms per step (median);" if h2d else ""
        return Finding(
            rule=self.id,
            severity=Severity.MEDIUM if (saving or 0) >= 1 else Severity.LOW,
            title="The CUDA run's DataLoader does not pin memory",
            evidence=evidence,
            recommendation=(
                f"pin_memory is off on a CUDA run:{h2d_text} pageable copies cannot overlap "
                "compute. Set pin_memory=True and copy with non_blocking=True."
            ),
            fix=Fix(code=FIX_CODE, config_patch=dict(PATCH)),
            estimated_saving_pct=r(saving, 1) if saving is not None else None,
        )

    examples: ClassVar = (
        Example(
            "trace: 64 MiB of pageable HtoD copies",
            True,
            lambda: ex.inputs(
                trace=ex.trace(
                    copies=[
                        {
                            "direction": "HtoD",
                            "src_memory": "Pageable",
                            "dst_memory": "Device",
                            "count": 10,
                            "bytes": 64 * 2**20,
                            "dur_us": 6000.0,
                        }
                    ]
                )
            ),
        ),
        Example(
            "trace: pinned HtoD and pageable DtoH copies only",
            False,
            lambda: ex.inputs(
                trace=ex.trace(
                    copies=[
                        {
                            "direction": "HtoD",
                            "src_memory": "Pinned",
                            "dst_memory": "Device",
                            "count": 10,
                            "bytes": 64 * 2**20,
                            "dur_us": 3000.0,
                        },
                        {
                            "direction": "DtoH",
                            "src_memory": "Device",
                            "dst_memory": "Pageable",
                            "count": 10,
                            "bytes": 64 * 2**20,
                            "dur_us": 6000.0,
                        },
                        {
                            "direction": "DtoD",
                            "src_memory": "Device",
                            "dst_memory": "Device",
                            "count": 10,
                            "bytes": 64 * 2**20,
                            "dur_us": 100.0,
                        },
                    ]
                )
            ),
        ),
        Example(
            "run on CUDA with pin_memory=false",
            True,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(10, step_time_ms=40.0, h2d_ms=4.0, cuda_allocated_bytes=2**30),
                    config={"data.pin_memory": False, "data.non_blocking": True},
                    environment=ex.CUDA_ENV,
                )
            ),
        ),
        Example(
            "run on CUDA with pin_memory=true",
            False,
            lambda: ex.inputs(
                run=ex.run(
                    ex.series(10, step_time_ms=40.0, h2d_ms=1.0),
                    config={"data.pin_memory": True},
                    environment=ex.CUDA_ENV,
                )
            ),
        ),
    )
