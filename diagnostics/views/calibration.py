"""Each rule's calibration across the re-runs in a runs folder: the saving its finding
predicted against the saving the re-run that applied its fix measured.

Compare shows this for one pair; here every pair in the folder counts, from what the runs
already hold: the first run's findings digest (``findings.json``: each fix's patch and
predicted saving, kept by its last analysis) and both runs' median steady step. A re-run
counts when its ``parent_run_id`` names the first run and it applied every key of one of
that run's fixes (``diagnostics.compare.fix_applied``, Compare's own test). Pairs whose
first run was not analysed since its records changed are counted as such, not guessed.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import polars as pl

from diagnostics.compare import Prediction, fix_applied, measured_saving_pct
from diagnostics.runs import RunFolder, RunFolderError, RunListing
from diagnostics.views.runs import RunFigures, run_figures


@dataclass(frozen=True)
class CalibrationPair:
    parent: str
    rerun: str
    prediction: Prediction


@dataclass(frozen=True)
class RuleCalibration:
    rule: str
    pairs: tuple[CalibrationPair, ...]

    @property
    def ratios(self) -> list[float]:
        return [
            ratio
            for pair in self.pairs
            if (ratio := pair.prediction.measured_over_predicted) is not None
        ]

    @property
    def median_ratio(self) -> float | None:
        return statistics.median(self.ratios) if self.ratios else None


@dataclass(frozen=True)
class Calibration:
    rules: tuple[RuleCalibration, ...]
    unanalysed_parents: int  # re-runs whose first run has no current findings digest


def _figures_from_folder(run: RunListing) -> RunFigures:
    return run_figures(RunFolder(run.path))


def calibrate(
    listings: Iterable[RunListing],
    read_figures: Callable[[RunListing], RunFigures] = _figures_from_folder,
) -> Calibration:
    """The calibration of every rule with a re-run here. ``read_figures``: a run's figures,
    as the runs table reads them (the app passes its cached reader); each run's once."""
    runs = {run.run_id: run for run in listings if run.error is None}
    known: dict[str, RunFigures] = {}

    def figures_of(run: RunListing) -> RunFigures:
        if run.run_id not in known:
            known[run.run_id] = read_figures(run)
        return known[run.run_id]

    by_rule: dict[str, list[CalibrationPair]] = {}
    unanalysed = 0
    for rerun in runs.values():
        parent = runs.get(rerun.parent_run_id or "")
        if parent is None or rerun.status.status != "completed":
            continue
        digest = figures_of(parent).findings
        if digest is None:
            unanalysed += 1
            continue
        try:
            applied = RunFolder(rerun.path).manifest().applied_patch or {}
        except RunFolderError:
            continue
        fix = next((f for f in digest.fixes if fix_applied(f.patch, applied)), None)
        if fix is None:
            continue
        measured = measured_saving_pct(
            figures_of(parent).median_step_ms, figures_of(rerun).median_step_ms
        )
        prediction = Prediction(fix.rule, dict(fix.patch), fix.saving_pct, measured)
        by_rule.setdefault(fix.rule, []).append(
            CalibrationPair(parent.run_id, rerun.run_id, prediction)
        )
    rules = tuple(RuleCalibration(rule, tuple(pairs)) for rule, pairs in sorted(by_rule.items()))
    return Calibration(rules=rules, unanalysed_parents=unanalysed)


CALIBRATION_COLUMNS = {
    "rule": "rule",
    "re-runs": "re-runs with its fix",
    "predicted": "predicted saving, median (%)",
    "measured": "measured saving, median (%)",
    "ratio": "measured ÷ predicted, median",
    "range": "measured ÷ predicted, range",
}


def calibration_table(calibration: Calibration) -> pl.DataFrame:
    """One row per rule with re-runs: how many, the predicted and measured savings' medians
    and the ratio's median and range (people's column names)."""
    rows = []
    for rule in calibration.rules:
        predicted = [p.prediction.predicted_saving_pct for p in rule.pairs]
        measured = [m for p in rule.pairs if (m := p.prediction.measured_saving_pct) is not None]
        ratios = rule.ratios
        rows.append(
            {
                "rule": rule.rule,
                "re-runs": len(rule.pairs),
                "predicted": round(statistics.median(predicted), 1),
                "measured": round(statistics.median(measured), 1) if measured else None,
                "ratio": round(rule.median_ratio, 2) if rule.median_ratio is not None else None,
                "range": f"{min(ratios):.2f}–{max(ratios):.2f}" if len(ratios) > 1 else "—",
            }
        )
    schema = {
        "rule": pl.String,
        "re-runs": pl.Int64,
        "predicted": pl.Float64,
        "measured": pl.Float64,
        "ratio": pl.Float64,
        "range": pl.String,
    }
    return pl.DataFrame(rows, schema=schema).rename(CALIBRATION_COLUMNS)
