"""What the app's pages show, computed without streamlit or torch.

Pages stay thin: they call one function here (or in the analyser/launcher) and render what
comes back. Everything here is pure and typed so it is tested without a browser: numbers
formatted for people, the runs table, summary cards, live progress, evidence rows, re-run
overrides and the upload location.
"""

from __future__ import annotations

import math
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import polars as pl

from diagnostics.report import fmt as report_fmt
from diagnostics.report.metrics import KeyMetrics
from diagnostics.runs import RunFolder, RunListing, RunStatus

# ---------------------------------------------------------------------------------------
# numbers for people


def _missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and not math.isfinite(value))


def fmt_ms(value_ms: float | None) -> str:
    """A duration given in milliseconds: '840 µs', '12.3 ms', '1.25 s', '3 min 20 s'."""
    if _missing(value_ms):
        return "—"
    value_ms = float(value_ms)
    if abs(value_ms) < 1.0:
        return f"{value_ms * 1000:.0f} µs"
    if abs(value_ms) < 100.0:
        return f"{value_ms:.1f} ms"
    if abs(value_ms) < 1000.0:
        return f"{value_ms:.0f} ms"
    return fmt_seconds(value_ms / 1000.0)


def fmt_seconds(value_s: float | None) -> str:
    """A duration in seconds: '4.2 s', '3 min 20 s', '1 h 05 min'."""
    if _missing(value_s):
        return "—"
    value_s = float(value_s)
    if value_s < 60.0:
        return f"{value_s:.1f} s" if value_s < 10 else f"{value_s:.0f} s"
    minutes, seconds = divmod(int(round(value_s)), 60)
    if minutes < 60:
        return f"{minutes} min {seconds:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def fmt_bytes(value: float | None) -> str:
    """Binary units, three significant figures: '512 B', '1.50 KiB', '23.4 MiB', '1.02 GiB'."""
    if _missing(value):
        return "—"
    value = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024.0 or unit == "TiB":
            return f"{value:.0f} B" if unit == "B" else f"{value:.3g} {unit}"
        value /= 1024.0
    raise AssertionError("unreachable")


def fmt_pct(value_pct: float | None, digits: int = 1) -> str:
    if _missing(value_pct):
        return "—"
    return f"{float(value_pct):.{digits}f} %"


def fmt_saving(value_pct: float | None) -> str:
    """An estimated saving: whole percent, and 'under 1 %' rather than a misleading '0 %'."""
    if _missing(value_pct):
        return "—"
    return "under 1 %" if float(value_pct) < 0.5 else f"{float(value_pct):.0f} %"


def fmt_number(value: float | None) -> str:
    """A plain quantity: thousands separated, at most three significant decimals."""
    if _missing(value):
        return "—"
    value = float(value)
    if value == int(value) and abs(value) < 1e15:
        return f"{int(value):,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return f"{value:.3g}"


def fmt_rate(value: float | None, unit: str) -> str:
    """A rate such as samples/s: '1,234 samples/s', '12.5 steps/s'."""
    if _missing(value):
        return "—"
    value = float(value)
    text = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"
    return f"{text} {unit}"


def fmt_ratio(value: float | None) -> str:
    """A ratio as a multiplier: '2.41×'."""
    if _missing(value):
        return "—"
    return f"{float(value):.2f}×"


def fmt_when(timestamp: float | None, now: float | None = None) -> str:
    """Unix seconds as 'just now', '5 min ago', '3 h ago', else the UTC date and time."""
    if _missing(timestamp) or not timestamp:
        return "—"
    now = time.time() if now is None else now
    age_s = now - float(timestamp)
    if 0 <= age_s < 45:
        return "just now"
    if 0 <= age_s < 3600:
        return f"{max(1, round(age_s / 60))} min ago"
    if 0 <= age_s < 24 * 3600:
        return f"{round(age_s / 3600)} h ago"
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(float(timestamp)))


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, bool | int | float | str)


_ACRONYMS = {"gpu": "GPU", "cpu": "CPU", "h2d": "H2D", "amp": "AMP", "lr": "LR", "rss": "RSS"}


def evidence_rows(evidence: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The evidence a person reads: (label, formatted value), worded as in the reports.

    Scalars are formatted by the unit in their key (``report.fmt``); short lists of
    scalars are joined; series and nested data meant for charts are left to the chart.
    """
    rows: list[tuple[str, str]] = []
    for key, value in evidence.items():
        label = " ".join(_ACRONYMS.get(w, w) for w in report_fmt.label(key).split(" "))
        label = label[:1].upper() + label[1:]
        if _is_scalar(value):
            rows.append((label, report_fmt.evidence_value(key, value)))
        elif isinstance(value, list | tuple):
            items = list(value)
            if 0 < len(items) <= 8 and all(_is_scalar(v) for v in items):
                rows.append((label, ", ".join(report_fmt.evidence_value(key, v) for v in items)))
    return rows


# ---------------------------------------------------------------------------------------
# runs

# Streamlit markdown badges (colour and a Material icon) for statuses and severities;
# tables get the plain word, as their cells do not render markdown.
STATUS_BADGES: dict[str, str] = {
    "running": ":blue-badge[:material/sync: running]",
    "completed": ":green-badge[:material/check_circle: completed]",
    "failed": ":red-badge[:material/error: failed]",
    "cancelled": ":gray-badge[:material/stop_circle: cancelled]",
    "preempted": ":orange-badge[:material/pause_circle: preempted]",
    "dead": ":red-badge[:material/heart_broken: dead]",
}
SEVERITY_BADGES: dict[str, str] = {
    "high": ":red-badge[:material/error: high]",
    "medium": ":orange-badge[:material/warning: medium]",
    "low": ":blue-badge[:material/info: low]",
}


RUN_STATES: tuple[str, ...] = tuple(STATUS_BADGES)


def status_badge(status: str) -> str:
    return STATUS_BADGES.get(status, f":gray-badge[{status}]")


def severity_badge(severity: str) -> str:
    return SEVERITY_BADGES.get(severity, f":gray-badge[{severity}]")


def run_duration_s(status: RunStatus, now: float | None = None) -> float | None:
    if status.started_at is None:
        return None
    end = status.ended_at
    if end is None:
        end = (time.time() if now is None else now) if status.is_active else status.heartbeat
    return None if end is None else max(0.0, end - status.started_at)


def filter_runs(
    listings: Iterable[RunListing],
    *,
    statuses: Iterable[str] = (),
    scenarios: Iterable[str] = (),
) -> list[RunListing]:
    """Runs whose status and scenario are among those chosen (nothing chosen = all)."""
    statuses, scenarios = set(statuses), set(scenarios)
    return [
        run
        for run in listings
        if (not statuses or run.status.status in statuses)
        and (not scenarios or (run.scenario or "—") in scenarios)
    ]


def runs_table(listings: Iterable[RunListing], now: float | None = None) -> pl.DataFrame:
    """One row per run for the runs table; 'open' is the run-detail link."""
    now = time.time() if now is None else now
    rows = []
    for run in listings:
        status = run.status
        total = status.total_steps
        rows.append(
            {
                "run": run.run_id,
                "scenario": run.scenario or "—",
                "status": status.status,
                "progress": (min(1.0, status.step / total) if total else None),
                "steps": f"{status.step:,}" + (f" / {total:,}" if total else ""),
                "started": fmt_when(run.created_at, now),
                "duration": fmt_seconds(run_duration_s(status, now)),
                "re-run of": run.parent_run_id or "",
                "note": run.error or (status.reason or ""),
                "open": f"Run_detail?run={run.run_id}",
            }
        )
    schema = {
        "run": pl.String,
        "scenario": pl.String,
        "status": pl.String,
        "progress": pl.Float64,
        "steps": pl.String,
        "started": pl.String,
        "duration": pl.String,
        "re-run of": pl.String,
        "note": pl.String,
        "open": pl.String,
    }
    return pl.DataFrame(rows, schema=schema)


def run_choice_label(run: RunListing, now: float | None = None) -> str:
    """How a run reads in a picker: id · scenario · status · age."""
    return (
        f"{run.run_id} · {run.scenario or 'no scenario'} · {run.status.status} · "
        f"{fmt_when(run.created_at, now)}"
    )


def find_run(listings: Iterable[RunListing], run_id: str | None) -> RunListing | None:
    if not run_id:
        return None
    return next((run for run in listings if run.run_id == run_id), None)


def children_of(listings: Iterable[RunListing], run_id: str) -> list[RunListing]:
    """Re-runs launched from this run (parent_run_id == run_id), newest first."""
    return [run for run in listings if run.parent_run_id == run_id]


def safe_run_path(runs_dir: str | Path, run_id: str) -> Path | None:
    """The run folder for an id taken from a URL; None for anything that escapes runs_dir."""
    if not run_id or not re.fullmatch(r"[A-Za-z0-9._-]+", run_id) or run_id in {".", ".."}:
        return None
    path = Path(runs_dir) / run_id
    return path if RunFolder.is_run_folder(path) else None


# ---------------------------------------------------------------------------------------
# summary cards


@dataclass(frozen=True)
class Card:
    label: str
    value: str
    help: str


def summary_cards(metrics: KeyMetrics) -> list[Card]:
    """The five cards at the top of a run or trace, formatted (KeyMetrics is shared with
    the reports and the comparison, so the page and a downloaded report agree)."""
    # the unit goes in the label: a value like "1,234 samples/s" does not fit a card
    if metrics.samples_per_s is not None:
        throughput_label, throughput = "Samples/s", fmt_rate(metrics.samples_per_s, "").strip()
        throughput_help = "Throughput: samples per second of step time (first step left out)."
    else:
        throughput_label, throughput = "Steps/s", fmt_rate(metrics.steps_per_s, "").strip()
        throughput_help = "Throughput: steps per second of step time (a trace has no batch size)."
    memory_kind = metrics.peak_memory_kind or "memory"
    return [
        Card(
            "Median step time",
            fmt_ms(metrics.median_step_time_ms),
            "Half the steps were faster than this (data wait + copy + compute + optimiser).",
        ),
        Card(throughput_label, throughput, throughput_help),
        Card(
            "GPU utilisation",
            fmt_pct(metrics.gpu_utilization_pct),
            "Share of time the GPU ran kernels, copies or memsets ('—' without a GPU).",
        ),
        Card(
            "Data-wait share",
            fmt_pct(metrics.data_wait_pct),
            "Share of step time spent blocked waiting for the next batch.",
        ),
        Card(
            "Peak memory",
            fmt_bytes(metrics.peak_memory_bytes),
            f"Highest {memory_kind} seen.",
        ),
    ]


# ---------------------------------------------------------------------------------------
# live progress


@dataclass(frozen=True)
class Progress:
    status: str
    reason: str | None
    step: int
    total_steps: int | None
    fraction: float  # 0..1 for the progress bar
    steps_per_s: float | None
    eta_s: float | None
    elapsed_s: float | None

    @property
    def text(self) -> str:
        parts = [f"step {self.step:,}" + (f" of {self.total_steps:,}" if self.total_steps else "")]
        if self.steps_per_s is not None:
            parts.append(f"{self.steps_per_s:.2f} steps/s")
        if self.eta_s is not None and self.status == "running":
            parts.append(f"about {fmt_seconds(self.eta_s)} left")
        if self.elapsed_s is not None:
            parts.append(f"{fmt_seconds(self.elapsed_s)} elapsed")
        return " · ".join(parts)


def progress(status: RunStatus, steps: pl.DataFrame, now: float | None = None) -> Progress:
    """Progress of a run from its status and the step records written so far.

    The step rate is measured over the last (up to) 20 steps' wall times so it follows the
    current pace rather than including start-up (model build, worker spawn).
    """
    step = max(status.step, int(steps.height and steps.get_column("step").max() or 0))
    total = status.total_steps
    fraction = min(1.0, step / total) if total else 0.0
    if status.status == "completed":
        fraction = 1.0
    rate = None
    wall = steps.get_column("wall_time").drop_nulls() if steps.height else None
    if wall is not None and wall.len() >= 2:
        recent = wall.tail(21)
        span = float(recent.max()) - float(recent.min())
        if span > 0:
            rate = (recent.len() - 1) / span
    eta = None
    if rate and total and step < total:
        eta = (total - step) / rate
    return Progress(
        status=status.status,
        reason=status.reason,
        step=step,
        total_steps=total,
        fraction=fraction,
        steps_per_s=rate,
        eta_s=eta,
        elapsed_s=run_duration_s(status, now),
    )


# ---------------------------------------------------------------------------------------
# configs and re-runs


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """{'data': {'num_workers': 0}} -> {'data.num_workers': 0}; dotted keys pass through."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, f"{dotted}."))
        else:
            flat[dotted] = value
    return flat


def rerun_overrides(
    config: Mapping[str, Any], patch: Mapping[str, Any], known_keys: Iterable[str]
) -> dict[str, Any]:
    """The overrides that rebuild a run's config exactly, with the patch applied on top.

    Every known key of the stored config is passed (not just the preset's differences) so
    the re-run keeps what the first run had even if a scenario preset changed since.
    """
    known = set(known_keys)
    flat = {k: v for k, v in flatten_config(config).items() if k in known}
    flat.update(patch)
    return flat


def patch_rows(patch: Mapping[str, Any], before: Mapping[str, Any] | None = None) -> pl.DataFrame:
    """A config patch as a table: setting, from, to."""
    before_flat = flatten_config(before or {})
    return pl.DataFrame(
        {
            "setting": list(patch.keys()),
            "from": [_config_text(before_flat.get(k, "—")) for k in patch],
            "to": [_config_text(v) for v in patch.values()],
        },
        schema={"setting": pl.String, "from": pl.String, "to": pl.String},
    )


def _config_text(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def config_table(config: Mapping[str, Any]) -> pl.DataFrame:
    """A stored config as setting/value rows (the scenario first)."""
    flat = flatten_config(config)
    keys = sorted(flat, key=lambda k: (k != "scenario", k))
    return pl.DataFrame(
        {"setting": keys, "value": [_config_text(flat[k]) for k in keys]},
        schema={"setting": pl.String, "value": pl.String},
    )


def patch_summary(patch: Mapping[str, Any] | None) -> str:
    """'data.num_workers = 4, data.pin_memory = true' for captions and links."""
    if not patch:
        return "no changes"
    return ", ".join(f"{k} = {_config_text(v)}" for k, v in patch.items())


def resolve_runs_dir(environ: Mapping[str, str]) -> Path:
    """The runs directory the app reads and launches into (same rule as trainer.launch)."""
    return Path(environ.get("PIPELINE_DOCTOR_RUNS_DIR") or "runs")


def patch_command(patch: Mapping[str, Any], config: Mapping[str, Any] | None = None) -> str:
    """The trainer command that re-runs a scenario with a patch."""
    scenario = (config or {}).get("scenario")
    head = "python -m trainer run" + (f" --scenario {scenario}" if scenario else "")
    return " ".join([head, *(f"--set {k}={_config_text(v)}" for k, v in patch.items())])


def tensorboard_command(run_path: str | Path) -> str:
    return f"tensorboard --logdir {Path(run_path) / 'trace'}"


# ---------------------------------------------------------------------------------------
# uploads

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def safe_upload_name(name: str) -> str:
    """A file name from a browser made safe for the disk: no folders, no odd characters."""
    base = Path(name.replace("\\", "/")).name
    cleaned = _UNSAFE.sub("_", base).strip("._") or "trace.json"
    return cleaned[:120]


def is_trace_name(name: str) -> bool:
    return name.lower().endswith((".json", ".json.gz"))


def upload_key(files: Iterable[tuple[str, int, str]]) -> str:
    """A stable key for a set of uploads (name, size, content digest), order-independent."""
    return "|".join(sorted(f"{name}:{size}:{digest}" for name, size, digest in files))


def saved_upload_dir(runs_dir: str | Path, now: float | None = None) -> Path:
    """Where 'Save upload' keeps files: <runs_dir>/uploads/<UTC stamp>/."""
    now = time.time() if now is None else now
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + f"-{int((now % 1) * 1000):03d}"
    return Path(runs_dir) / "uploads" / stamp


def _unique_names(names: Sequence[str]) -> list[str]:
    """Safe disk names, numbered where two uploads would share one."""
    seen: dict[str, int] = {}
    unique = []
    for name in names:
        safe = safe_upload_name(name)
        count = seen.get(safe, 0)
        seen[safe] = count + 1
        if count:
            stem, dot, ext = safe.partition(".")
            safe = f"{stem}-{count}{dot}{ext}"
        unique.append(safe)
    return unique


def write_uploads(files: Sequence[tuple[str, BinaryIO]], folder: Path) -> list[Path]:
    """Streams uploads into folder in 1 MiB chunks (never a second in-memory copy)."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for (_, handle), safe in zip(files, _unique_names([n for n, _ in files]), strict=True):
        path = folder / safe
        handle.seek(0)
        with path.open("wb") as out:
            shutil.copyfileobj(handle, out, length=1024 * 1024)
        paths.append(path)
    return paths


# One trace per rank: enough for a node or two; more would hold too much in memory at once.
MAX_UPLOAD_FILES = 16


def analyse_uploads(
    files: Sequence[tuple[str, BinaryIO]],
    analyse: Callable[..., Any],
    temp_root: str | Path | None = None,
) -> Any:
    """Analyses uploaded traces from a private temporary folder that is always removed.

    ``analyse`` is ``diagnostics.analyze.analyze_files``; it receives the temporary paths
    and the names the user uploaded, so messages name the user's file, not the temp copy.
    Raises InputError (from the analyser, or here for a file that is not a trace).
    """
    from diagnostics.errors import InputError

    if len(files) > MAX_UPLOAD_FILES:
        raise InputError(
            f"{len(files)} files",
            f"too many at once; upload at most {MAX_UPLOAD_FILES} (one per rank)",
        )
    for name, _ in files:
        if not is_trace_name(name):
            raise InputError(name, "not a trace file; upload .json or .json.gz files")
    folder = Path(tempfile.mkdtemp(prefix="pipeline-doctor-upload-", dir=temp_root))
    try:
        paths = write_uploads(files, folder)
        return analyse(paths, display_names=[name for name, _ in files])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def save_uploads(
    files: Sequence[tuple[str, BinaryIO]], runs_dir: str | Path, now: float | None = None
) -> Path:
    """Keeps the uploads the user chose to save under <runs_dir>/uploads/<stamp>/."""
    folder = saved_upload_dir(runs_dir, now)
    write_uploads(files, folder)
    return folder


def source_caption(source: Mapping[str, Any], environment: Mapping[str, Any]) -> str:
    """'2 ranks · cuda · NVIDIA A100-SXM4-80GB · PyTorch 2.1' from an analysis' source/env."""
    parts = []
    ranks = source.get("ranks")
    count = len(ranks) if isinstance(ranks, Sequence) and not isinstance(ranks, str) else ranks
    if isinstance(count, int) and count > 1:
        parts.append(f"{count} ranks")
    for key, prefix in (("device", ""), ("gpu_name", ""), ("pytorch_version", "PyTorch ")):
        value = environment.get(key)
        if value:
            parts.append(f"{prefix}{value}")
    return " · ".join(parts) or "trace"


# ---------------------------------------------------------------------------------------
# comparison

_UNIT_FORMAT: dict[str, Callable[[float | None], str]] = {
    "ms": fmt_ms,
    "%": fmt_pct,
    "bytes": fmt_bytes,
    "samples/s": lambda v: fmt_rate(v, "samples/s"),
    "steps/s": lambda v: fmt_rate(v, "steps/s"),
}


def comparison_table(rows: Sequence[Any], label_a: str, label_b: str) -> pl.DataFrame:
    """Compare's MetricRows as text: measure, A, B, B ÷ A and a verdict."""
    records = []
    for row in rows:
        formatter = _UNIT_FORMAT.get(row.unit, fmt_number)
        verdict = {True: "better", False: "worse", None: "—"}[row.improved]
        records.append(
            {
                "measure": row.label[:1].upper() + row.label[1:],
                label_a: formatter(row.a),
                label_b: formatter(row.b),
                "B ÷ A": fmt_ratio(row.ratio),
                "change": verdict,
            }
        )
    return pl.DataFrame(
        records,
        schema={
            "measure": pl.String,
            label_a: pl.String,
            label_b: pl.String,
            "B ÷ A": pl.String,
            "change": pl.String,
        },
    )


def headline(rows: Sequence[Any]) -> str | None:
    """'B runs 2.41× the throughput of A' — the one line a comparison is about."""
    for row in rows:
        if row.key == "throughput" and row.ratio is not None:
            return f"B has {fmt_ratio(row.ratio)} the throughput of A ({row.unit})."
    return None


def config_changes_table(changes: Sequence[tuple[str, Any, Any]]) -> pl.DataFrame:
    return pl.DataFrame(
        {
            "setting": [c[0] for c in changes],
            "A": [_config_text(c[1]) for c in changes],
            "B": [_config_text(c[2]) for c in changes],
        },
        schema={"setting": pl.String, "A": pl.String, "B": pl.String},
    )


def default_pair(listings: Sequence[RunListing]) -> tuple[str | None, str | None]:
    """The pair to compare when none is asked for: the newest re-run and its parent,
    else the two newest runs (older as A)."""
    ids = {run.run_id for run in listings}
    for run in listings:
        if run.parent_run_id and run.parent_run_id in ids:
            return run.parent_run_id, run.run_id
    if len(listings) >= 2:
        return listings[1].run_id, listings[0].run_id
    return (listings[0].run_id, None) if listings else (None, None)


@dataclass(frozen=True)
class CompareCard:
    label: str
    value: str  # B's value
    delta: str | None  # signed change vs A, e.g. "+141 % (2.41×)"
    delta_color: str  # streamlit's: "normal" (up is good), "inverse" (down is good), "off"


def comparison_card(row: Any) -> CompareCard:
    """One metric card: B's value and its change against A (green when it improved)."""
    formatter = _UNIT_FORMAT.get(row.unit, fmt_number)
    delta = None
    if row.unit == "%" and row.delta is not None:
        # a share is compared in percentage points: 60 % -> 5 % is "-55 points"
        delta = f"{row.delta:+.1f} points"
    elif row.ratio is not None:
        change_pct = (row.ratio - 1.0) * 100.0
        delta = f"{change_pct:+.0f} % ({fmt_ratio(row.ratio)})"
    colour = {"higher": "normal", "lower": "inverse"}.get(row.better, "off")
    label = row.label[:1].upper() + row.label[1:]
    value = formatter(row.b)
    if row.unit.endswith("/s"):  # "25.1 samples/s" does not fit a card: the unit goes up
        label, value = f"{label} ({row.unit})", fmt_rate(row.b, "").strip()
    return CompareCard(label, value, delta, colour)


# ---------------------------------------------------------------------------------------
# the launch form


@dataclass(frozen=True)
class FormField:
    key: str  # the trainer's dotted config key
    label: str
    widget: str  # "int", "float", "bool", "choice", "clip" (float, 0 = off)
    help: str = ""


# Sections of the launch form, in order. Numbers are free-form (no widget bounds) so the
# trainer's own validation judges them and its message shows next to the field.
LAUNCH_FORM: tuple[tuple[str, tuple[FormField, ...]], ...] = (
    (
        "Run",
        (
            FormField("device", "Device", "choice", "auto = CUDA when present, else CPU"),
            FormField("train.steps", "Fine-tuning steps", "int"),
            FormField("train.batch_size", "Batch size", "int"),
            FormField("train.pretrain_steps", "Masked-LM steps first (0 = none)", "int"),
        ),
    ),
    (
        "Data loading",
        (
            FormField("data.num_workers", "DataLoader workers", "int"),
            FormField("data.pin_memory", "Pinned host memory (pin_memory)", "bool"),
            FormField(
                "data.sample_latency_ms", "Simulated storage latency per sample (ms)", "float"
            ),
        ),
    ),
    (
        "Precision and stability",
        (
            FormField("train.amp", "Mixed precision (AMP)", "choice"),
            FormField("train.grad_clip", "Gradient clipping, max norm (0 = off)", "clip"),
            FormField("train.lr", "Learning rate", "float"),
        ),
    ),
    (
        "Profiler schedule",
        (
            FormField("profiler.enabled", "Record a trace", "bool"),
            FormField("profiler.wait", "Wait steps", "int"),
            FormField("profiler.warmup", "Warm-up steps", "int"),
            FormField("profiler.active", "Active (recorded) steps", "int"),
            FormField("profiler.repeat", "Cycles (0 = until the end)", "int"),
        ),
    ),
)


def form_value(form_field: FormField, preset_value: Any) -> Any:
    """What a widget starts at for a scenario's preset value."""
    if form_field.widget == "clip":
        return 0.0 if preset_value is None else float(preset_value)
    if form_field.widget == "float":
        return float(preset_value)
    return preset_value


def form_overrides(values: Mapping[str, Any]) -> dict[str, Any]:
    """Widget values -> trainer overrides (a clipping of 0 means no clipping: null)."""
    clip_keys = {f.key for _, fields in LAUNCH_FORM for f in fields if f.widget == "clip"}
    return {
        key: (None if key in clip_keys and value == 0 else value) for key, value in values.items()
    }


# ---------------------------------------------------------------------------------------
# chart inputs taken from findings (the same choices as the reports make)


def spike_steps(findings: Iterable[Any]) -> list[int]:
    """Steps an unstable-gradients finding marks, for the loss/grad-norm chart."""
    for finding in findings:
        for key in ("spike_steps", "outlier_steps"):
            values = (finding.evidence or {}).get(key)
            if isinstance(values, list | tuple):
                return [int(v) for v in values if isinstance(v, int | float)]
    return []


def leak_slope(findings: Iterable[Any]) -> tuple[float | None, str]:
    """A leak finding's fitted growth (bytes/step) and the memory column it was fitted on."""
    for finding in findings:
        if "leak" not in finding.rule:
            continue
        for key, value in (finding.evidence or {}).items():
            if key.endswith("bytes_per_step") and isinstance(value, int | float):
                return float(value), "cuda_allocated_bytes" if "cuda" in key else "rss_bytes"
    return None, "rss_bytes"


def operator_time_column(operators: pl.DataFrame) -> str:
    """device_us when the trace has GPU time for its operators, else host_us."""
    if "device_us" in operators.columns and (operators["device_us"].fill_null(0) > 0).any():
        return "device_us"
    return "host_us"


def form_error_summary(errors: Mapping[str, str]) -> tuple[list[str], str | None]:
    """(messages for no single form field, the count line for the fields' own messages)."""
    form_keys = {form_field.key for _, section in LAUNCH_FORM for form_field in section}
    others = [message for key, message in errors.items() if key not in form_keys]
    count = sum(key in form_keys for key in errors)
    if not count:
        return others, None
    plural = count > 1
    summary = (
        f"{count} setting{'s' if plural else ''} need{'' if plural else 's'} fixing: "
        "see the messages next to the fields."
    )
    return others, summary
