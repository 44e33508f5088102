"""worker-restarts: DataLoader workers are started again at every epoch.

What it finds
    A run with DataLoader workers and ``persistent_workers`` off whose first step of each
    new epoch waits for data far longer than the other steps: the wait at each epoch start
    against the median wait of the steps within epochs, reported per epoch with the time
    lost. The reference trainer's sharded dataset (``data.dataset: sharded``) gets fresh
    workers every epoch even with ``persistent_workers`` on, so such runs are judged too.

Why it matters
    Without ``persistent_workers=True`` the DataLoader shuts its worker processes down at
    the end of every epoch and forks new ones at the start of the next, which re-imports,
    re-opens the dataset and refills the prefetch queue while the training step waits.
    Short epochs (small or sharded datasets, frequent evaluation) pay it often.

How to fix
    ``DataLoader(..., num_workers=N, persistent_workers=True)``. An iterable dataset whose
    order changes per epoch must then learn the epoch inside its workers (e.g. count its
    own ``__iter__`` calls); the reference trainer's map-style dataset does that already.
"""

from __future__ import annotations

from typing import Any, ClassVar

import polars as pl

from diagnostics.model import AnalysisInputs
from diagnostics.rules import examples as ex
from diagnostics.rules.base import (
    Example,
    Finding,
    Fix,
    Rule,
    Severity,
    need_run_steps,
    need_trainer_config,
)
from diagnostics.rules.evidence import chart, config_value, has_steps, numeric, r
from diagnostics.thresholds import Thresholds

FIX_CODE = """\
# before: workers are torn down and forked again every epoch
loader = DataLoader(dataset, batch_size=32, num_workers=4)

# after: the same workers serve every epoch
loader = DataLoader(dataset, batch_size=32, num_workers=4, persistent_workers=True)
"""


def _sharded(run: Any) -> bool:
    # the reference trainer's sharded IterableDataset: its shard order changes per epoch,
    # so it gets fresh workers whatever persistent_workers says (its run notes say so)
    return config_value(run, "data.dataset") == "sharded"


def _patch(sharded: bool) -> dict[str, Any]:
    if sharded:
        return {"data.dataset": "map", "data.persistent_workers": True}
    return {"data.persistent_workers": True}


class WorkerRestarts(Rule):
    id = "worker-restarts"
    title = "DataLoader workers restart at every epoch"
    severity = Severity.LOW
    needs = (
        need_trainer_config("data.num_workers, data.persistent_workers, data.dataset"),
        need_run_steps("epoch", "data_wait_ms"),
    )
    threshold_names = ("epoch_start_wait_ratio", "epoch_start_wait_min_ms")

    def not_applicable(self, inputs: AnalysisInputs) -> str | None:
        run = inputs.run
        assert run is not None  # needs run step records
        workers = config_value(run, "data.num_workers")
        if not isinstance(workers, int) or workers == 0:
            return "the DataLoader has no worker processes to restart (num_workers is 0 or unknown)"
        if config_value(run, "data.persistent_workers") is True and not _sharded(run):
            return "persistent_workers is on: workers live across epochs"
        if run.steps["epoch"].n_unique() < 2:
            return "the run never crossed an epoch boundary"
        return None

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        import numpy as np

        run = inputs.run
        assert run is not None
        steps = run.steps.filter(pl.col("data_wait_ms").is_not_null()).sort("step")
        first_epoch = steps["epoch"].min()
        starts = (
            steps.group_by("epoch").agg(pl.col("step").min()).filter(pl.col("epoch") > first_epoch)
        )
        start_steps = set(starts["step"].to_list())
        # the run's first step forks the first workers: neither a restart nor the baseline
        within = steps.slice(1).filter(~pl.col("step").is_in(list(start_steps)))
        if within.height < 3 or not start_steps:
            return []
        baseline = float(np.median(numeric(within, "data_wait_ms")))
        at_start = steps.filter(pl.col("step").is_in(list(start_steps)))
        waits = numeric(at_start, "data_wait_ms")
        typical = float(np.median(waits))
        extra = typical - baseline
        if (
            typical < thresholds.epoch_start_wait_ratio * max(baseline, 1e-9)
            or extra < thresholds.epoch_start_wait_min_ms
        ):
            return []
        total_ms = float(steps["step_time_ms"].sum()) if has_steps(run, "step_time_ms") else None
        lost_ms = float(sum(w - baseline for w in waits))
        saving = 100.0 * lost_ms / total_ms if total_ms else None
        workers = config_value(run, "data.num_workers")
        sharded = _sharded(run)
        evidence: dict[str, Any] = {
            "source": "run step records: data wait at each epoch's first step vs within epochs",
            "num_workers": workers,
            "persistent_workers": config_value(run, "data.persistent_workers"),
            "dataset": config_value(run, "data.dataset"),
            "epoch_start_steps": sorted(start_steps),
            "epoch_start_wait_ms": [r(w) for w in waits],
            "within_epoch_wait_ms_median": r(baseline),
            "extra_ms_per_epoch": r(extra),
            "lost_ms_total": r(lost_ms),
            "steps": [int(steps["step"].min()), int(steps["step"].max())],
            "chart": chart(
                "bar",
                "DataLoader wait per step (epoch starts highlighted)",
                "step",
                "data wait (ms)",
                steps["step"].to_list(),
                {"data wait (ms)": numeric(steps, "data_wait_ms")},
                highlight_x=sorted(start_steps),
            ),
        }
        return [
            Finding(
                rule=self.id,
                severity=self.severity,
                title=f"Each epoch starts with a {typical:.0f} ms wait for new DataLoader workers",
                evidence=evidence,
                recommendation=(
                    f"The first step of each epoch waits {typical:.0f} ms for data (median) "
                    f"against {baseline:.1f} ms within epochs: the {workers} worker(s) are "
                    "forked again every epoch. "
                    + (
                        "The sharded dataset ignores persistent_workers: use the map-style "
                        "dataset, whose workers persist."
                        if sharded
                        else "Set persistent_workers=True."
                    )
                ),
                fix=Fix(code=FIX_CODE, config_patch=_patch(sharded)),
                estimated_saving_pct=r(saving, 1) if saving is not None else None,
            )
        ]

    examples: ClassVar = (
        Example(
            "run: 3 epochs of 10 steps, each epoch start waits 300 ms against 2 ms",
            True,
            lambda: _three_epochs(epoch_start_wait_ms=300.0, persistent_workers=False),
        ),
        Example(
            "run: persistent workers, epoch starts wait like any other step",
            False,
            lambda: _three_epochs(epoch_start_wait_ms=2.0, persistent_workers=True),
            skipped=True,
        ),
        Example(
            "run: sharded dataset (persistent_workers ignored), epoch starts wait 300 ms",
            True,
            lambda: _three_epochs(
                epoch_start_wait_ms=300.0, persistent_workers=True, dataset="sharded"
            ),
        ),
        Example(
            "run: workers off, epoch starts no slower than the rest",
            False,
            lambda: _three_epochs(
                epoch_start_wait_ms=3.0, persistent_workers=False, step_time_ms=102.0
            ),
        ),
    )


def _three_epochs(
    epoch_start_wait_ms: float, step_time_ms: float | None = None, **data: Any
) -> AnalysisInputs:
    """3 epochs of 10 steps with 2 workers: each epoch's first step waits
    ``epoch_start_wait_ms`` for its batch, the others 2 ms; a step is 100 ms plus its wait
    unless ``step_time_ms`` says otherwise (examples)."""

    def wait(s: int) -> float:
        return epoch_start_wait_ms if s % 10 == 1 else 2.0

    return ex.cpu_run(
        30,
        config={"data": {"num_workers": 2, **data}},
        epoch=lambda s: (s - 1) // 10,
        data_wait_ms=wait,
        step_time_ms=(lambda s: 100.0 + wait(s)) if step_time_ms is None else step_time_ms,
    )
