"""The run folder: the one typed module that writes and reads a profiled run.

The trainer writes through :class:`RunWriter`; the analyser, the app and the reports read
through :class:`RunFolder`. Nothing else parses run files by hand.

Layout (``RUN_FOLDER_VERSION`` 1)::

    runs/<run_id>/
      run.json            manifest: version, run_id, created_at, config, environment,
                          parent_run_id, applied_patch, notes
      status.json         status, reason, heartbeat, pid, started_at, ended_at, step, total_steps
      steps.jsonl         one StepRecord a line, appended and flushed while running
      samples.jsonl       one SystemSample a line (one per GPU per tick; gpu_index null on CPU)
      steps.parquet       written by finalise(); preferred by the reader when present
      samples.parquet
      trace/              torch.profiler traces, tensorboard_trace_handler layout (*.pt.trace.json.gz)
      checkpoints/        step_00000100.pt ...
      memory_lines.jsonl  line-level memory (memory_profiler), one line record a row
      dataloaders.jsonl   script runs: one DataLoaderRecord per DataLoader the script built
      memory/             CUDA memory snapshots (*.pickle, *.pickle.gz), oldest name first:
                          step_00000100.pickle ..., oom_step_00000123.pickle (docs/MEMORY.md)
      log.txt             the trainer's log
      tokenizer.json      the run's own tokenizer (resume reuses it rather than retrain one)
      cancel.request      touched to ask the trainer to stop (status cancelled); removed on resume
      steps.rank<k>.jsonl distributed runs: rank k > 0's records (rank 0 keeps the names
      samples.rank<k>.jsonl  above); log.rank<k>.txt; status.rank<k>.json, each rank's end
      findings.json       the last analysis' findings in brief, for the runs table: counts by
                          severity and rule ids, with the mtime_key of the records it read
                          (stale once they change); written by whoever analysed the run
      alert.json          the too-long-run alert (runtime.alert_after_s / --alert-after-s):
                          state, threshold_s, webhook host, step, elapsed_s, reason (absent:
                          no alert asked for; docs/RUN-FOLDER.md)
      run.lock            held by the one trainer writing the folder: {"pid", "host", "at"}
                          (O_EXCL; trainer/run_lock.py; a dead holder's lock is recovered)

Every timestamp called ``wall_time`` is Unix seconds from ``time.time()`` in the trainer
process, so step records and system samples join on one clock.

Crash safety: the line files are appended with a flush per record (and an fsync at most
once a second), status.json is replaced atomically, so a run killed with SIGKILL loses at
most the last second of records and a torn last line is skipped by the reader.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import socket
import stat
import threading
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, ClassVar, Literal

from diagnostics.severity import SEVERITY_ORDER

if TYPE_CHECKING:
    import polars as pl

RUN_FOLDER_VERSION = 1

# A running trainer refreshes its heartbeat at least this often...
HEARTBEAT_INTERVAL_S = 2.0
# ...so a "running" status whose heartbeat is older than this is reported as dead.
HEARTBEAT_STALE_AFTER_S = 15.0
RECORD_FLUSH_INTERVAL_S = 0.5  # a script run's step records: written at most this late

# "dead": running but silent past HEARTBEAT_STALE_AFTER_S; "unreadable": run.json or
# status.json could not be read (the listing's reason says why), set by list_runs only
RunState = Literal["running", "completed", "failed", "cancelled", "preempted", "dead", "unreadable"]
WRITTEN_STATES: frozenset[str] = frozenset(
    {"running", "completed", "failed", "cancelled", "preempted"}
)
FINAL_STATES: frozenset[str] = frozenset({"completed", "failed", "cancelled", "preempted"})

MANIFEST_FILE = "run.json"
STATUS_FILE = "status.json"
STEPS_LINES = "steps.jsonl"
SAMPLES_LINES = "samples.jsonl"
STEPS_PARQUET = "steps.parquet"
SAMPLES_PARQUET = "samples.parquet"
MEMORY_LINES_FILE = "memory_lines.jsonl"
DATALOADERS_FILE = "dataloaders.jsonl"
SNAPSHOT_DIR = "memory"
LOG_FILE = "log.txt"
LOCK_FILE = "run.lock"
TRACE_DIR = "trace"
CHECKPOINT_DIR = "checkpoints"
RANK_STATUS_FILE = "status.rank{rank}.json"  # every rank's own end, aggregated into status.json
TOKENIZER_FILE = "tokenizer.json"
CANCEL_FILE = "cancel.request"
ALERT_FILE = "alert.json"
FINDINGS_FILE = "findings.json"
# armed: waiting for the threshold; sending: passed it, the post in flight; sent / failed:
# the post's outcome; not_configured: no webhook set (the state says if the run passed it)
ALERT_STATES: frozenset[str] = frozenset({"armed", "sending", "sent", "failed", "not_configured"})

RUNS_DIR_ENV = "PIPELINE_DOCTOR_RUNS_DIR"
DEFAULT_RUNS_DIR = "runs"


def default_runs_dir(environ: Mapping[str, str] | None = None) -> Path:
    """Where runs live: ``$PIPELINE_DOCTOR_RUNS_DIR``, or ``./runs`` when it is unset or empty.

    Read at each call (never at import), so the trainer, the launcher and the app agree even
    when the variable is set after they were imported.
    """
    value = (os.environ if environ is None else environ).get(RUNS_DIR_ENV)
    return Path(value or DEFAULT_RUNS_DIR)


# Column -> dtype for each record kind (STEP_SCHEMA, SAMPLE_SCHEMA, MEMORY_LINE_SCHEMA).
# Records may carry fewer fields (None is written as null); the reader always returns
# every column below, in this order. Built on first use: importing polars costs 0.5-1 s,
# which the profile launcher and a script's process would pay before the script's first
# line although neither reads a frame until the run has ended.
@cache
def _schemas() -> dict[str, dict[str, pl.DataType]]:
    import polars as pl

    steps: dict[str, pl.DataType] = {
        "step": pl.Int64,  # global optimiser step, 1-based
        "epoch": pl.Int64,
        "phase": pl.String,  # "pretrain" (masked LM) or "finetune"
        "wall_time": pl.Float64,  # Unix seconds at the end of the step
        "step_time_ms": pl.Float64,  # end-to-end: data wait + copy + compute + optimiser
        "data_wait_ms": pl.Float64,  # blocked in next(dataloader_iter)
        # of data_wait_ms, the time before the batch had finished loading (its collate
        # ended after the step asked for it); the rest was handing a loaded batch over.
        # The trainer's records only: null where the batch carries no load stamp
        "loading_wait_ms": pl.Float64,
        "h2d_ms": pl.Float64,  # host-to-device copy of the batch
        "compute_ms": pl.Float64,  # forward + backward
        "optimizer_ms": pl.Float64,  # clip + optimiser step + zero_grad
        # the training thread runnable but without a CPU (another process or thread had it);
        # null where the OS does not say. Not a part of the step: it overlaps the parts above
        "cpu_wait_ms": pl.Float64,
        "loss": pl.Float64,
        "grad_norm": pl.Float64,  # total L2 norm before clipping
        "lr": pl.Float64,
        "amp_scale": pl.Float64,  # GradScaler scale; null without a scaler
        "batch_size": pl.Int64,
        "samples_per_s": pl.Float64,
        # a script run's tokens of the step's batches with input_ids (the attention mask's
        # sum where it was on the CPU, else every id) and their token-weighted mean padded
        # length; null for other batches, and in the trainer's records
        "tokens": pl.Int64,
        "seq_len": pl.Float64,
        "rss_bytes": pl.Int64,  # trainer process resident set size
        "cuda_allocated_bytes": pl.Int64,
        "cuda_reserved_bytes": pl.Int64,
        "cuda_peak_bytes": pl.Int64,
        "profiled": pl.Boolean,  # inside the profiler's active window
        # known causes of extra time in this step, comma-separated (null: none): profiler_warmup,
        # profiler_active, after_trace_export, epoch_start, after_evaluation, after_checkpoint,
        # memory_history (CUDA allocator history on: probe/memory_snapshots.py)
        "marks": pl.String,
        # embedding-store reads of the step's batch (trainer/embedding_store.py); null
        # without a store: read transactions, keys read, time inside the reads
        "store_reads": pl.Int64,
        "store_keys": pl.Int64,
        "store_read_ms": pl.Float64,
    }

    samples: dict[str, pl.DataType] = {
        "wall_time": pl.Float64,
        "cpu_percent": pl.Float64,  # whole host, all cores (100 = one core busy... x cores)
        # the training process's and its DataLoader workers' share of it since the previous
        # sample (same unit); what is left of cpu_percent is other processes' (null: unknown)
        "trainer_cpu_percent": pl.Float64,
        "workers_cpu_percent": pl.Float64,
        # of other processes' CPU, the part that yields to the training process (lower
        # priority, weighed by CFS's weights) since the previous scan; scanned once a second,
        # null on the other samples and where unknown (probe/system.py)
        "lower_priority_cpu_percent": pl.Float64,
        "trainer_rss_bytes": pl.Int64,
        "workers_rss_bytes": pl.Int64,  # sum over live DataLoader worker processes (USS-free RSS)
        "worker_count": pl.Int64,
        "gpu_index": pl.Int64,  # null when NVML is unavailable
        "gpu_util_pct": pl.Float64,
        "gpu_mem_used_bytes": pl.Int64,
        "gpu_mem_total_bytes": pl.Int64,
        "gpu_power_w": pl.Float64,
        "gpu_sm_clock_mhz": pl.Float64,
        "gpu_temp_c": pl.Float64,
    }

    memory_lines: dict[str, pl.DataType] = {
        "function": pl.String,  # qualified name of the profiled function
        "filename": pl.String,
        "line": pl.Int64,
        "mem_usage_mib": pl.Float64,  # memory_profiler's process memory after the line
        "increment_mib": pl.Float64,  # summed over every call of the function
        "occurrences": pl.Int64,
        "source": pl.String,
    }
    return {"STEP_SCHEMA": steps, "SAMPLE_SCHEMA": samples, "MEMORY_LINE_SCHEMA": memory_lines}


def __getattr__(name: str) -> Any:
    if name in ("STEP_SCHEMA", "SAMPLE_SCHEMA", "MEMORY_LINE_SCHEMA"):
        return _schemas()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# run.json's "kind": what made the run. Folders written before the field existed are the
# reference trainer's.
RunKind = Literal["trainer", "script"]
RUN_KINDS: frozenset[str] = frozenset({"trainer", "script"})


@dataclass(frozen=True)
class DataLoaderRecord:
    """One DataLoader a profiled script built: where, and with which arguments.

    The arguments are the loader's own attributes after construction (what it runs
    with); ``overridden`` holds, for each argument a ``--override dataloader.KEY=VALUE``
    replaced, the value the script's code passed.
    """

    index: int  # order of construction in the process, from 0
    file: str | None  # absolute path of the user's code that built it
    line: int | None
    site: str | None  # as shown to the user: "train.py:37" (relative to the script's folder)
    code: str | None  # that line of source, stripped
    dataset_class: str | None
    batch_size: int | None
    num_workers: int | None
    pin_memory: bool | None
    persistent_workers: bool | None
    prefetch_factor: int | None
    overridden: dict[str, Any] = field(default_factory=dict)
    # at the run's end: batches fetched and time waited on the training thread (null
    # before, or when the process never got there)
    batches: int | None = None
    wait_ms: float | None = None
    # of ``wait_ms``, the CPU time of the training thread itself: the rest is I/O, sleep or
    # waiting for worker processes
    wait_cpu_ms: float | None = None
    # the framework whose code called DataLoader(...): "transformers" (HF's Trainer, from
    # its TrainingArguments: ``site`` is then the user's trainer.train() line), "lightning",
    # "accelerate"; None for the user's own call, and in files written before it was kept
    built_by: str | None = None

    ARGUMENTS: ClassVar[tuple[str, ...]] = (
        "batch_size",
        "num_workers",
        "pin_memory",
        "persistent_workers",
        "prefetch_factor",
    )

    def call_text(self, names: Iterable[str] | None = None) -> str:
        """``DataLoader(batch_size=64, num_workers=0, pin_memory=False)``: the arguments
        named (all by default), each as the loader runs with it."""
        shown = [n for n in (names or self.ARGUMENTS) if n in self.ARGUMENTS]
        return "DataLoader(" + ", ".join(f"{n}={getattr(self, n)!r}" for n in shown) + ")"

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> DataLoaderRecord | None:
        """The typed record; None for a line whose fields have the wrong types."""

        def typed(key: str, kinds: tuple[type, ...]) -> Any:
            value = raw.get(key)
            if value is None:
                return None
            if isinstance(value, bool) and bool not in kinds:
                raise TypeError(key)
            if not isinstance(value, kinds):
                raise TypeError(key)
            return value

        try:
            index = typed("index", (int,))
            overridden = raw.get("overridden") or {}
            if index is None or not isinstance(overridden, dict):
                return None
            return cls(
                index=index,
                file=typed("file", (str,)),
                line=typed("line", (int,)),
                site=typed("site", (str,)),
                code=typed("code", (str,)),
                dataset_class=typed("dataset_class", (str,)),
                batch_size=typed("batch_size", (int,)),
                num_workers=typed("num_workers", (int,)),
                pin_memory=typed("pin_memory", (bool,)),
                persistent_workers=typed("persistent_workers", (bool,)),
                prefetch_factor=typed("prefetch_factor", (int,)),
                overridden=dict(overridden),
                batches=typed("batches", (int,)),
                wait_ms=float(w) if (w := typed("wait_ms", (int, float))) is not None else None,
                wait_cpu_ms=(
                    float(c) if (c := typed("wait_cpu_ms", (int, float))) is not None else None
                ),
                built_by=typed("built_by", (str,)),
            )
        except TypeError:
            return None


def rank_file(name: str, rank: int) -> str:
    """A rank's file name: rank 0 keeps the single-process name (``steps.jsonl``), so a
    distributed run reads as a single-process one; rank k > 0 gets ``steps.rank<k>.jsonl``."""
    if rank == 0:
        return name
    stem, dot, ext = name.partition(".")
    return f"{stem}.rank{rank}{dot}{ext}"


class RunFolderError(Exception):
    """A run folder is missing, unreadable or of an unknown version."""


@dataclass(frozen=True)
class RunStatus:
    status: RunState
    reason: str | None = None
    heartbeat: float | None = None
    pid: int | None = None
    host: str | None = None
    started_at: float | None = None
    ended_at: float | None = None
    step: int = 0
    total_steps: int | None = None

    @property
    def is_final(self) -> bool:
        return self.status in FINAL_STATES

    @property
    def is_active(self) -> bool:
        return self.status == "running"


def _parse_status(path: Path, raw: Mapping[str, Any]) -> RunStatus:
    """The typed status; any field of the wrong type makes the whole file unreadable."""
    state = raw.get("status")
    if state not in WRITTEN_STATES:
        raise RunFolderError(f"{path}: unreadable (status is {state!r})")
    return RunStatus(
        status=state,
        reason=_field(path, raw, "reason", (str,), None),
        heartbeat=_field(path, raw, "heartbeat", _NUMBER, None),
        pid=_field(path, raw, "pid", (int,), None),
        host=_field(path, raw, "host", (str,), None),
        started_at=_field(path, raw, "started_at", _NUMBER, None),
        ended_at=_field(path, raw, "ended_at", _NUMBER, None),
        step=_field(path, raw, "step", (int,), 0),
        total_steps=_field(path, raw, "total_steps", (int,), None),
    )


@dataclass(frozen=True)
class AlertState:
    """The too-long-run alert of one run, as ``alert.json`` holds it."""

    state: str  # one of ALERT_STATES
    threshold_s: float
    webhook: str | None = None  # scheme://host[:port] only: the URL's path is its secret
    step: int | None = None  # the run's step when it passed the threshold
    elapsed_s: float | None = None  # None: not passed (yet)
    reason: str | None = None  # why it failed or was not sent
    http_status: int | None = None
    text: str | None = None  # the message posted (or that would have been)
    updated_at: float | None = None

    @property
    def passed(self) -> bool:
        return self.elapsed_s is not None


def _parse_alert(path: Path, raw: Mapping[str, Any]) -> AlertState:
    state = raw.get("state")
    if state not in ALERT_STATES:
        raise RunFolderError(f"{path}: unreadable (state is {state!r})")
    threshold = _field(path, raw, "threshold_s", _NUMBER, None)
    if threshold is None:
        raise RunFolderError(f"{path}: unreadable (threshold_s is missing)")
    elapsed = _field(path, raw, "elapsed_s", _NUMBER, None)
    updated = _field(path, raw, "updated_at", _NUMBER, None)
    return AlertState(
        state=state,
        threshold_s=float(threshold),
        webhook=_field(path, raw, "webhook", (str,), None),
        step=_field(path, raw, "step", (int,), None),
        elapsed_s=None if elapsed is None else float(elapsed),
        reason=_field(path, raw, "reason", (str,), None),
        http_status=_field(path, raw, "http_status", (int,), None),
        text=_field(path, raw, "text", (str,), None),
        updated_at=None if updated is None else float(updated),
    )


def write_alert_state(run_dir: str | os.PathLike[str], payload: Mapping[str, Any]) -> None:
    """Replaces ``alert.json`` (atomically; the alert's own thread is its one writer)."""
    _atomic_write_json(Path(run_dir) / ALERT_FILE, payload)


_MANIFEST_CORE_KEYS = frozenset(
    {"version", "run_id", "created_at", "config", "environment", "parent_run_id"}
    | {"applied_patch", "notes"}
)


@dataclass(frozen=True)
class RunManifest:
    version: int
    run_id: str
    created_at: float
    config: dict[str, Any]
    environment: dict[str, Any]
    parent_run_id: str | None = None
    applied_patch: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    # fields the trainer adds while running (e.g. model_parameters, vocab_usage)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def scenario(self) -> str | None:
        return self.config.get("scenario")

    @property
    def kind(self) -> RunKind:
        """``script`` for a user's script under ``pipeline-doctor profile``, else ``trainer``."""
        return "script" if self.extra.get("kind") == "script" else "trainer"


def _atomic_write_json(
    path: Path, payload: Mapping[str, Any], *, last_resort: bool = False
) -> None:
    """Replaces ``path`` atomically; a failed write (a full disk) leaves no ``.tmp`` behind.

    With ``last_resort`` a write that fails for want of space is retried in place: the
    truncation frees the old file's blocks, which the new (same-sized) content then
    reuses. Used for the final status only, where a torn file (read as "unreadable")
    is still better than a run stuck at "running".
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    text = json.dumps(payload, indent=2, sort_keys=True, default=str)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            tmp.unlink()
        if not last_resort:
            raise
        with path.open("w") as handle:
            handle.write(text)


# A run folder is read under bounds, as an uploaded trace is: a folder someone else made
# (or a link someone put in it) must not make a reader follow a link out of it, read a
# device without end, or hold gigabytes.
MAX_RUN_JSON_BYTES = 16 << 20  # run.json, status.json, a rank's status, alert.json
MAX_RUN_LINE_BYTES = 1 << 20  # one record of a .jsonl file
MAX_RUN_RECORDS = 5_000_000  # records of one .jsonl file (a step each: a very long run)
# a duration no real step or wait has (11.6 days); negative ones neither
MAX_RECORD_MS = 1e9


def _open_run_file(path: Path) -> IO[bytes]:
    """``path`` opened for reading if it is a regular file of its run folder; a symbolic
    link is followed only to a regular file inside the folder. RunFolderError (one line)
    otherwise; FileNotFoundError when there is nothing there."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        target = Path(os.path.realpath(path))
        folder = Path(os.path.realpath(path.parent))
        if not target.is_relative_to(folder):
            raise RunFolderError(f"{path}: a link out of the run folder (to {target}): not read")
        info = os.stat(path)
    if not stat.S_ISREG(info.st_mode):
        raise RunFolderError(f"{path}: not a regular file: not read")
    return path.open("rb")


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a run file; RunFolderError (one line) for anything else."""
    try:
        with _open_run_file(path) as handle:
            data = handle.read(MAX_RUN_JSON_BYTES + 1)
        if len(data) > MAX_RUN_JSON_BYTES:
            raise RunFolderError(
                f"{path}: larger than the {MAX_RUN_JSON_BYTES >> 20} MiB a run file may be: "
                "not read"
            )
        raw = json.loads(data)
    except FileNotFoundError:
        raise RunFolderError(f"{path}: missing") from None
    except RecursionError:
        raise RunFolderError(f"{path}: unreadable (JSON nested too deeply)") from None
    except (OSError, ValueError) as exc:
        problem = " ".join(str(exc).split())
        raise RunFolderError(f"{path}: unreadable ({problem})") from None
    if not isinstance(raw, dict):
        raise RunFolderError(f"{path}: unreadable (a JSON {type(raw).__name__}, not an object)")
    return raw


_NUMBER = (int, float)


# world_size is how many ranks' files the reader looks for, one by one: the largest jobs
# run tens of thousands of processes, and a value past this is a typo, not a run
_MOST_PROCESSES = 2**20


def _check_distributed(path: Path, info: Any) -> None:
    """A manifest's ``distributed`` block: an object whose ``world_size``, when present, is
    a whole number of processes; RunFolderError naming the field otherwise."""
    if info is None:
        return
    if not isinstance(info, dict):
        raise RunFolderError(f"{path}: unreadable (distributed is {info!r:.60}, not an object)")
    size = info.get("world_size")
    if size is None:
        return
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= _MOST_PROCESSES:
        raise RunFolderError(
            f"{path}: unreadable (distributed.world_size is {size!r:.60}, not a whole number "
            f"of processes from 1 to {_MOST_PROCESSES:,})"
        )


def _field(path: Path, raw: Mapping[str, Any], key: str, kinds: tuple[type, ...], default: Any):
    """``raw[key]`` if it has one of ``kinds`` (None allowed when the default is None)."""
    value = raw.get(key, default)
    if value is None and default is None:
        return None
    if (isinstance(value, bool) and bool not in kinds) or not isinstance(value, kinds):
        expected = " or ".join(kind.__name__ for kind in kinds)
        raise RunFolderError(f"{path}: unreadable ({key} is {value!r}, not {expected})")
    return value


def _read_lines(path: Path) -> tuple[list[dict[str, Any]], int]:
    """Records of a .jsonl file, and how many lines were not one: a torn or corrupt line
    (a killed writer) is skipped, and so is a line longer than MAX_RUN_LINE_BYTES (read
    past in pieces, never held). More than MAX_RUN_RECORDS records is RunFolderError."""
    records: list[dict[str, Any]] = []
    skipped = 0
    try:
        handle = _open_run_file(path)
    except FileNotFoundError:
        return records, skipped
    with handle:
        while raw := handle.readline(MAX_RUN_LINE_BYTES + 1):
            if len(raw) > MAX_RUN_LINE_BYTES:
                while raw and not raw.endswith(b"\n"):
                    raw = handle.readline(MAX_RUN_LINE_BYTES + 1)
                skipped += 1
                continue
            try:
                record = json.loads(raw)
            except ValueError:
                skipped += raw.strip() != b""
                continue
            if not isinstance(record, dict):
                skipped += 1
                continue
            if len(records) >= MAX_RUN_RECORDS:
                raise RunFolderError(
                    f"{path}: more than {MAX_RUN_RECORDS:,} records: not read (no run this "
                    "reader knows writes that many)"
                )
            records.append(record)
    return records, skipped


def _fits(value: Any, dtype: pl.DataType) -> bool:
    """A JSON value of the column's type (null always fits; bool is no number here)."""
    import polars as pl

    if value is None:
        return True
    if dtype == pl.Int64:
        return type(value) is int and -(2**63) <= value < 2**63
    if dtype == pl.Float64:  # NaN and inf included: a diverged loss is a record, not an error
        return type(value) in (int, float)
    if dtype == pl.Boolean:
        return type(value) is bool
    if dtype == pl.String:
        return type(value) is str
    return True


def _typed_records(
    records: list[dict[str, Any]], schema: dict[str, pl.DataType]
) -> tuple[list[dict[str, Any]], Counter[str]]:
    """The records whose every field has its column's type, and the fields that did not
    (a record with one wrong field is left out whole: its other numbers are suspect too)."""
    kept: list[dict[str, Any]] = []
    wrong: Counter[str] = Counter()
    durations = [name for name in schema if name.endswith("_ms")]
    for record in records:
        bad = [name for name, dtype in schema.items() if not _fits(record.get(name), dtype)]
        # a duration no real run has (1e300 ms, a negative wait) is no figure to average
        bad += [
            name
            for name in durations
            if type(value := record.get(name)) in (int, float)
            and not 0 <= value <= MAX_RECORD_MS
            and name not in bad
        ]
        if bad:
            wrong.update(bad)
        else:
            kept.append(record)
    return kept, wrong


def _frame(records: list[dict[str, Any]], schema: dict[str, pl.DataType]) -> pl.DataFrame:
    import polars as pl

    columns = {name: [rec.get(name) for rec in records] for name in schema}
    return pl.DataFrame(columns, schema=schema, strict=False)


def _conform(frame: pl.DataFrame, schema: dict[str, pl.DataType]) -> pl.DataFrame:
    """Every schema column, in order, with its dtype (older files may lack new columns)."""
    import polars as pl

    return frame.select(
        [
            pl.col(name).cast(dtype, strict=False)
            if name in frame.columns
            else pl.lit(None, dtype=dtype).alias(name)
            for name, dtype in schema.items()
        ]
    )


class RunFolder:
    """Read-only, typed access to one run folder. Cheap to construct; reads lazily."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        # records left out as read (wrong types, no step number): file -> one warning
        self._left_out: dict[str, str] = {}

    def record_warnings(self) -> tuple[str, ...]:
        """Why records read so far were left out, one line per file (empty: none were)."""
        return tuple(self._left_out.values())

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    @property
    def run_id(self) -> str:
        return self.path.name

    @staticmethod
    def is_run_folder(path: str | os.PathLike[str]) -> bool:
        try:
            return (Path(path) / MANIFEST_FILE).is_file()
        except OSError:  # a folder we may not look into (/proc, another user's) is not one
            return False

    def manifest(self) -> RunManifest:
        path = self.path / MANIFEST_FILE
        raw = _read_json(path)
        version = raw.get("version")
        if version != RUN_FOLDER_VERSION:
            raise RunFolderError(
                f"{path}: run folder version {version!r} is not "
                f"supported (this reader knows {RUN_FOLDER_VERSION})"
            )
        notes = _field(path, raw, "notes", (list,), [])
        if not all(isinstance(note, str) for note in notes):
            raise RunFolderError(f"{path}: unreadable (notes are not all strings)")
        _check_distributed(path, raw.get("distributed"))
        return RunManifest(
            version=version,
            run_id=_field(path, raw, "run_id", (str,), self.run_id),
            created_at=float(_field(path, raw, "created_at", _NUMBER, 0.0)),
            config=dict(_field(path, raw, "config", (dict,), None) or {}),
            environment=dict(_field(path, raw, "environment", (dict,), None) or {}),
            parent_run_id=_field(path, raw, "parent_run_id", (str,), None),
            applied_patch=_field(path, raw, "applied_patch", (dict,), None),
            notes=tuple(notes),
            extra={k: v for k, v in raw.items() if k not in _MANIFEST_CORE_KEYS},
        )

    def status(self, now: float | None = None) -> RunStatus:
        """The run's status; a 'running' run whose heartbeat stopped is reported 'dead'."""
        path = self.path / STATUS_FILE
        if not path.exists():
            raise RunFolderError(f"{path}: missing")
        status = _parse_status(path, _read_json(path))
        if status.status == "running":
            now = time.time() if now is None else now
            heartbeat = status.heartbeat or status.started_at or 0.0
            if now - heartbeat > HEARTBEAT_STALE_AFTER_S:
                silent_s = now - heartbeat
                return RunStatus(
                    **{
                        **asdict(status),
                        "status": "dead",
                        "reason": f"no heartbeat for {silent_s:.0f} s (process gone?)",
                    }
                )
        return status

    def findings_digest(self) -> FindingsDigest | None:
        """The last analysis' findings in brief; None when the run was not analysed since
        its records last changed, or the file is not one we wrote."""
        path = self.path / FINDINGS_FILE
        try:
            raw = _read_json(path)
        except (RunFolderError, OSError):
            return None
        counts = raw.get("counts")
        rules = raw.get("rules")
        if (
            not isinstance(counts, dict)
            or set(counts) != set(SEVERITY_ORDER)
            or not all(isinstance(n, int) and n >= 0 for n in counts.values())
            or not isinstance(rules, list)
            or not all(isinstance(rule, str) for rule in rules)
            or raw.get("mtime_key") != self.mtime_key()
        ):
            return None
        fixes = raw.get("fixes", [])
        if not isinstance(fixes, list) or not all(_is_fix_digest(fix) for fix in fixes):
            return None
        return FindingsDigest(
            counts=dict(counts),
            rules=tuple(rules),
            fixes=tuple(
                DigestFix(fix["rule"], dict(fix["patch"]), float(fix["saving_pct"]))
                for fix in fixes
            ),
        )

    def write_findings_digest(self, digest: FindingsDigest, mtime_key: float) -> None:
        """Keeps ``digest`` for the records as of ``mtime_key`` (the key the analysis read
        them at). Raises OSError (a read-only folder): the caller decides."""
        payload = {
            "counts": digest.counts,
            "rules": list(digest.rules),
            "fixes": [
                {"rule": fix.rule, "patch": fix.patch, "saving_pct": fix.saving_pct}
                for fix in digest.fixes
            ],
            "mtime_key": mtime_key,
        }
        _atomic_write_json(self.path / FINDINGS_FILE, payload)

    def alert(self) -> AlertState | None:
        """The too-long-run alert's state; None when the run asked for no alert."""
        path = self.path / ALERT_FILE
        if not path.exists():
            return None
        return _parse_alert(path, _read_json(path))

    def steps(self) -> pl.DataFrame:
        """Per-step records, sorted by step (the last record wins for a repeated step)."""
        return self._records(STEPS_PARQUET, STEPS_LINES, _schemas()["STEP_SCHEMA"], key="step")

    def samples(self) -> pl.DataFrame:
        return self._records(SAMPLES_PARQUET, SAMPLES_LINES, _schemas()["SAMPLE_SCHEMA"], key=None)

    def world_size(self) -> int:
        """Processes of the job (1 for a single-process run), from the manifest."""
        info = self.manifest().extra.get("distributed") or {}
        return int(info.get("world_size") or 1)

    def rank_steps(self) -> pl.DataFrame:
        """Every rank's step records, with a leading ``rank`` column (0 only when single)."""
        import polars as pl

        frames = [self.steps().select(pl.lit(0, dtype=pl.Int64).alias("rank"), pl.all())]
        for rank in range(1, self.world_size()):
            parquet = rank_file(STEPS_PARQUET, rank)
            lines = rank_file(STEPS_LINES, rank)
            frame = self._records(parquet, lines, _schemas()["STEP_SCHEMA"], key="step")
            frames.append(frame.select(pl.lit(rank, dtype=pl.Int64).alias("rank"), pl.all()))
        return pl.concat(frames)

    def last_step(self) -> int | None:
        """The step of rank 0's newest record, from the end of steps.jsonl (cheap: a live
        run's launcher asks every heartbeat)."""
        try:
            with _open_run_file(self.path / STEPS_LINES) as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - 8192))
                tail = handle.read(8192).splitlines()
        except (FileNotFoundError, RunFolderError):
            return None
        for raw in reversed(tail):
            try:
                record = json.loads(raw)
            except ValueError:
                continue  # a torn last line, or the cut first one
            if isinstance(record, dict) and isinstance(record.get("step"), int):
                return record["step"]
        return None

    def rank_statuses(self) -> dict[int, dict[str, Any] | None]:
        """Each rank's own final status (None for a rank that ended without writing one)."""
        statuses: dict[int, dict[str, Any] | None] = {}
        for rank in range(self.world_size()):
            try:
                statuses[rank] = _read_json(self.path / RANK_STATUS_FILE.format(rank=rank))
            except RunFolderError:
                statuses[rank] = None
        return statuses

    def dataloaders(self) -> tuple[DataLoaderRecord, ...]:
        """The DataLoaders a script run built (rank 0's), in order; () for trainer runs and
        for scripts that built none. A line that does not parse is skipped."""
        latest: dict[int, DataLoaderRecord] = {}
        for raw in _read_lines(self.path / DATALOADERS_FILE)[0]:
            record = DataLoaderRecord.from_dict(raw)
            if record is not None:
                latest[record.index] = record  # the end-of-run line, with totals, wins
        return tuple(latest[index] for index in sorted(latest))

    def memory_lines(self) -> pl.DataFrame | None:
        path = self.path / MEMORY_LINES_FILE
        if not path.exists():
            return None
        return _frame(_read_lines(path)[0], _schemas()["MEMORY_LINE_SCHEMA"])

    def _records(
        self, parquet: str, lines: str, schema: dict[str, pl.DataType], key: str | None
    ) -> pl.DataFrame:
        import polars as pl

        parquet_path = self.path / parquet
        if parquet_path.exists():
            try:
                with _open_run_file(parquet_path) as handle:
                    frame = _conform(pl.read_parquet(handle), schema)
            except RunFolderError:
                raise
            except Exception as exc:  # a parquet cut short by a crash: fall back to lines
                if not (self.path / lines).exists():
                    raise RunFolderError(f"{parquet_path}: unreadable ({exc})") from None
                frame = self._checked_lines(lines, schema, key)
        else:
            frame = self._checked_lines(lines, schema, key)
        if key is not None and frame.height:
            frame = frame.unique(subset=key, keep="last", maintain_order=True).sort(key)
        return frame

    def _checked_lines(
        self, lines: str, schema: dict[str, pl.DataType], key: str | None
    ) -> pl.DataFrame:
        """A .jsonl file's records as a frame; records with a field of the wrong type, or
        without the key, are left out and said (``record_warnings``), so the order and the
        statistics come from valid records only."""
        records, skipped = _read_lines(self.path / lines)
        kept, wrong = _typed_records(records, schema)
        if key is not None:
            keyed = [r for r in kept if r.get(key) is not None]
            if len(keyed) < len(kept):
                wrong[f"no {key}"] += len(kept) - len(keyed)
            kept = keyed
        said = []
        if skipped:
            said.append(f"left out {skipped:,} line(s) that are not a JSON record")
        if wrong:
            fields = ", ".join(f"{name} ({n})" for name, n in wrong.most_common(5))
            said.append(
                f"left out {len(records) - len(kept):,} of {len(records):,} records with a "
                f"field of the wrong type, out of range or missing: {fields}"
            )
        if said:
            self._left_out[lines] = f"{self.path / lines}: " + "; ".join(said)
        return _frame(kept, schema)

    @property
    def trace_dir(self) -> Path:
        return self.path / TRACE_DIR

    def trace_files(self) -> list[Path]:
        if not self.trace_dir.is_dir():
            return []
        return sorted(
            p
            for p in self.trace_dir.iterdir()
            if p.is_file() and (p.name.endswith(".json") or p.name.endswith(".json.gz"))
        )

    @property
    def snapshot_dir(self) -> Path:
        return self.path / SNAPSHOT_DIR

    def snapshot_files(self) -> list[Path]:
        """The run's CUDA memory snapshots, by name (step numbers zero-padded sort in
        order); an out-of-memory dump ``oom_*`` sorts after the steps' ones."""
        if not self.snapshot_dir.is_dir():
            return []
        found = [
            p
            for p in self.snapshot_dir.iterdir()
            if p.is_file() and p.name.endswith((".pickle", ".pickle.gz"))
        ]
        return sorted(found, key=lambda p: (p.name.startswith("oom"), p.name))

    def snapshot_path(self, step: int, *, oom: bool = False) -> Path:
        """Where a snapshot of ``step`` goes (diagnostics.snapshot.writer.write_snapshot)."""
        return self.snapshot_dir / f"{'oom_' if oom else ''}step_{step:08d}.pickle"

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / CHECKPOINT_DIR

    def checkpoints(self) -> list[Path]:
        if not self.checkpoint_dir.is_dir():
            return []
        return sorted(self.checkpoint_dir.glob("step_*.pt"))

    @property
    def log_path(self) -> Path:
        return self.path / LOG_FILE

    def log_tail(self, max_bytes: int = 20_000) -> str:
        try:
            with _open_run_file(self.log_path) as handle:
                handle.seek(0, os.SEEK_END)
                size = handle.tell()
                handle.seek(max(0, size - max_bytes))
                return handle.read(max_bytes).decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""
        except RunFolderError as exc:
            return f"(the log is not shown: {exc})"

    def mtime_key(self) -> float:
        """Latest modification time of the files a reader uses: a cache key."""
        latest = 0.0
        for name in (STATUS_FILE, STEPS_LINES, SAMPLES_LINES, STEPS_PARQUET, SAMPLES_PARQUET):
            with contextlib.suppress(FileNotFoundError):
                latest = max(latest, (self.path / name).stat().st_mtime)
        for trace in self.trace_files():
            latest = max(latest, trace.stat().st_mtime)
        return latest


@dataclass(frozen=True)
class DigestFix:
    """A finding's config patch and the saving it predicts: what a re-run that applies the
    patch is measured against (diagnostics.calibration)."""

    rule: str
    patch: dict[str, Any]
    saving_pct: float


def _is_fix_digest(raw: Any) -> bool:
    return (
        isinstance(raw, dict)
        and isinstance(raw.get("rule"), str)
        and isinstance(raw.get("patch"), dict)
        and all(isinstance(key, str) for key in raw["patch"])
        and isinstance(raw.get("saving_pct"), int | float)
        and not isinstance(raw.get("saving_pct"), bool)
        and math.isfinite(raw["saving_pct"])
    )


@dataclass(frozen=True)
class FindingsDigest:
    """An analysis' findings in brief: how many at each severity, their rule ids (worst
    first), and the fixes with a config patch and a predicted saving."""

    counts: dict[str, int]
    rules: tuple[str, ...]
    fixes: tuple[DigestFix, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class RunListing:
    path: Path
    run_id: str
    created_at: float
    scenario: str | None
    status: RunStatus
    parent_run_id: str | None = None
    error: str | None = None
    script: str | None = None  # a script run's file name (kind script), else None


def _script_name(manifest: RunManifest) -> str | None:
    if manifest.kind != "script":
        return None
    path = (manifest.extra.get("script") or {}).get("path")
    return Path(path).name if isinstance(path, str) and path else "a script"


def list_runs(runs_dir: str | os.PathLike[str]) -> list[RunListing]:
    """Every run folder under runs_dir, newest first.

    This is the one place that decides what a broken run looks like: a run whose run.json
    or status.json cannot be read is listed with status "unreadable", the reason in
    ``status.reason`` and ``error``, so every caller shows it and keeps the others.
    """
    root = Path(runs_dir)
    try:
        children = list(root.iterdir()) if root.is_dir() else []
    except OSError:  # not ours to read: as good as empty, never a traceback
        return []
    listings = []
    for child in children:
        if not RunFolder.is_run_folder(child):
            continue
        run = RunFolder(child)
        try:
            manifest = run.manifest()
            listings.append(
                RunListing(
                    path=child,
                    run_id=manifest.run_id,
                    created_at=manifest.created_at,
                    scenario=manifest.scenario,
                    status=run.status(),
                    parent_run_id=manifest.parent_run_id,
                    script=_script_name(manifest),
                )
            )
        except RunFolderError as exc:
            try:
                created_at = child.stat().st_mtime
            except OSError:
                created_at = 0.0
            listings.append(
                RunListing(
                    path=child,
                    run_id=child.name,
                    created_at=created_at,
                    scenario=None,
                    status=RunStatus(status="unreadable", reason=str(exc)),
                    error=str(exc),
                )
            )
    return sorted(listings, key=lambda r: r.created_at, reverse=True)


# a run id is a folder name printed as the last line of output and pasted into commands:
# letters, digits, '.', '_' and '-' only
RUN_ID_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def new_run_id(scenario: str | None, now: float | None = None) -> str:
    """``STAMP-NAME-SUFFIX``; NAME (a scenario, or ``script-`` and a script's stem) keeps
    only safe characters: a script named ``a\nb.py`` gives ``script-a-b``."""
    now = time.time() if now is None else now
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    suffix = f"{int((now % 1) * 1000):03d}{os.getpid() % 1000:03d}"
    name = RUN_ID_UNSAFE.sub("-", scenario or "").strip("-.") or "run"
    return f"{stamp}-{name}-{suffix}"


class _LineAppender:
    """Appends JSON lines, fsynced at most once a second.

    With ``flush_interval_s`` 0 each record is flushed as it comes (the reference trainer's
    steps are tens of ms). A profiled script's steps can be a fraction of a millisecond,
    where an encode-and-write per record was most of the instruments' cost: there records
    are buffered and written every ``flush_interval_s`` (or ``max_buffered`` records),
    by the next append or by :meth:`flush_if_stale` from another thread, and always on
    :meth:`close`. A SIGKILL loses at most that interval; any signal a process can catch
    unwinds through ``close``.
    """

    def __init__(
        self,
        path: Path,
        fsync_interval_s: float = 1.0,
        flush_interval_s: float = 0.0,
        max_buffered: int = 512,
    ):
        self._handle = path.open("a", encoding="utf-8")
        self._fsync_interval_s = fsync_interval_s
        self._flush_interval_s = flush_interval_s
        self._max_buffered = max_buffered
        self._last_fsync = self._last_flush = time.monotonic()
        self._buffer: list[Mapping[str, Any]] = []
        self._lock = threading.Lock()

    def append(self, record: Mapping[str, Any]) -> None:
        if not self._flush_interval_s:
            self._handle.write(_dump_line(record))
            self._flush_handle(time.monotonic())
            return
        with self._lock:
            self._buffer.append(record)
            if len(self._buffer) < self._max_buffered:
                now = time.monotonic()
                if now - self._last_flush < self._flush_interval_s:
                    return
        self.flush()

    def extend(self, records: list[Mapping[str, Any]]) -> None:
        """Several records at once: one lock and one clock read for the batch."""
        with self._lock:
            self._buffer.extend(records)
            fresh = time.monotonic() - self._last_flush < self._flush_interval_s
            if len(self._buffer) < self._max_buffered and fresh:
                return
        self.flush()

    def flush_if_stale(self) -> None:
        """Writes what is buffered once it is older than the interval (a quiet script)."""
        if self._buffer and time.monotonic() - self._last_flush >= self._flush_interval_s:
            self.flush()

    def flush(self) -> None:
        with self._lock:
            records, self._buffer = self._buffer, []
            if self._handle.closed:
                return
            if records:
                self._handle.write("".join(map(_dump_line, records)))
            self._flush_handle(time.monotonic())

    def _flush_handle(self, now: float) -> None:
        self._handle.flush()
        self._last_flush = now
        if now - self._last_fsync >= self._fsync_interval_s:
            os.fsync(self._handle.fileno())
            self._last_fsync = now

    def close(self) -> None:
        if not self._handle.closed:
            try:
                self.flush()
                os.fsync(self._handle.fileno())
            finally:
                with contextlib.suppress(OSError):  # the buffer a full disk refused
                    self._handle.close()


_ENCODER = json.JSONEncoder(check_circular=False, default=lambda value: _json_default(value))


def _dump_line(record: Mapping[str, Any]) -> str:
    return _ENCODER.encode(record) + "\n"


def _json_default(value: Any) -> Any:
    # numpy scalars and the like: anything with item() becomes a plain number
    if hasattr(value, "item"):
        return value.item()
    return str(value)


@dataclass
class RunWriter:
    """Writes one run folder. Create with :meth:`create` or reopen with :meth:`reopen`."""

    path: Path
    _steps: _LineAppender | None = field(default=None, repr=False)
    _samples: _LineAppender | None = field(default=None, repr=False)
    _status: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def create(
        cls,
        runs_dir: str | os.PathLike[str],
        config: Mapping[str, Any],
        environment: Mapping[str, Any],
        *,
        run_id: str | None = None,
        parent_run_id: str | None = None,
        applied_patch: Mapping[str, Any] | None = None,
        notes: Iterable[str] = (),
        total_steps: int | None = None,
        extra: Mapping[str, Any] | None = None,
    ) -> RunWriter:
        """A new run folder; FileExistsError if the id is taken (``mkdir`` decides, so of
        two processes creating one id at once exactly one wins). Any other OSError (a full
        disk, no permission) removes what was made: no half-made folder blocks the id.
        ``extra``: further manifest fields (a script run's ``kind``, ``command``, ...), in
        the first manifest written, so no reader ever sees the folder without them."""
        run_id = run_id or new_run_id(config.get("scenario"))
        path = Path(runs_dir) / run_id
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(exist_ok=False)
        try:
            (path / TRACE_DIR).mkdir()
            (path / CHECKPOINT_DIR).mkdir()
            _atomic_write_json(
                path / MANIFEST_FILE,
                {
                    "version": RUN_FOLDER_VERSION,
                    "run_id": run_id,
                    "created_at": time.time(),
                    "config": dict(config),
                    "environment": dict(environment),
                    "parent_run_id": parent_run_id,
                    "applied_patch": dict(applied_patch) if applied_patch else None,
                    "notes": list(notes),
                    **(extra or {}),
                },
            )
            writer = cls(path=path)
            now = time.time()
            writer._status = {
                "status": "running",
                "reason": None,
                "heartbeat": now,
                "pid": os.getpid(),
                "host": socket.gethostname(),
                "started_at": now,
                "ended_at": None,
                "step": 0,
                "total_steps": total_steps,
            }
            writer._write_status()
            writer._open_appenders()
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return writer

    @classmethod
    def reopen(cls, path: str | os.PathLike[str]) -> RunWriter:
        """Reopens an existing run (resume): status back to running, appends continue."""
        run = RunFolder(path)
        run.manifest()  # validates the version
        writer = cls(path=Path(path))
        previous = asdict(run.status())
        now = time.time()
        writer._status = {
            **previous,
            "status": "running",
            "reason": None,
            "heartbeat": now,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "ended_at": None,
        }
        # finalised parquet is stale once appends resume: the lines stay the source of truth
        for name in (STEPS_PARQUET, SAMPLES_PARQUET):
            (writer.path / name).unlink(missing_ok=True)
        writer._write_status()
        writer._open_appenders()
        return writer

    def _open_appenders(self) -> None:
        self._steps = _LineAppender(self.path / STEPS_LINES)
        self._samples = _LineAppender(self.path / SAMPLES_LINES)

    def _write_status(self) -> None:
        _atomic_write_json(self.path / STATUS_FILE, self._status)

    def update_manifest(self, **fields: Any) -> None:
        """Adds or replaces manifest fields (e.g. notes found while running)."""
        raw = _read_json(self.path / MANIFEST_FILE)
        raw.update(fields)
        _atomic_write_json(self.path / MANIFEST_FILE, raw)

    def add_note(self, note: str) -> None:
        raw = _read_json(self.path / MANIFEST_FILE)
        notes = list(raw.get("notes") or [])
        if note not in notes:
            notes.append(note)
        raw["notes"] = notes
        _atomic_write_json(self.path / MANIFEST_FILE, raw)

    def append_step(self, record: Mapping[str, Any]) -> None:
        assert self._steps is not None, "writer is closed"
        self._steps.append(record)
        step = record.get("step")
        if step is not None:
            self._status["step"] = int(step)

    def append_sample(self, record: Mapping[str, Any]) -> None:
        assert self._samples is not None, "writer is closed"
        self._samples.append(record)

    def set_step(self, step: int) -> None:
        """The step status.json reports (a distributed run's launcher: from rank 0)."""
        self._status["step"] = int(step)

    def heartbeat(self) -> None:
        self._status["heartbeat"] = time.time()
        self._write_status()

    @property
    def last_step(self) -> int:
        """The last step whose record was appended."""
        return int(self._status.get("step") or 0)

    def set_status(self, status: RunState, reason: str | None = None) -> None:
        now = time.time()
        self._status.update(status=status, reason=reason, heartbeat=now)
        final = status in FINAL_STATES
        if final:
            self._status["ended_at"] = now
        _atomic_write_json(self.path / STATUS_FILE, self._status, last_resort=final)

    def finalise(self, status: RunState, reason: str | None = None) -> None:
        """Closes the line files, writes the parquet copies, then the final status.

        The parquet copies are a convenience (the reader falls back to the line files), so
        a disk too full for them still gets the final status and loses no record.
        """
        for appender in (self._steps, self._samples):
            if appender is not None:
                with contextlib.suppress(OSError):  # a full disk: the flushed lines stay
                    appender.close()
        run = RunFolder(self.path)
        for name, frame in ((STEPS_PARQUET, run.steps()), (SAMPLES_PARQUET, run.samples())):
            tmp = self.path / f".{name}.tmp"
            try:
                frame.write_parquet(tmp)
                os.replace(tmp, self.path / name)
            except Exception:  # polars reports a full disk as its own error type
                with contextlib.suppress(OSError):
                    tmp.unlink()
                (self.path / name).unlink(missing_ok=True)  # never a stale copy
        self.set_status(status, reason)

    def append_dataloader(self, record: Mapping[str, Any]) -> None:
        """One DataLoaderRecord's fields as a line of ``dataloaders.jsonl``."""
        appender = _LineAppender(self.path / DATALOADERS_FILE)
        try:
            appender.append(record)
        finally:
            appender.close()

    def write_memory_lines(self, rows: Iterable[Mapping[str, Any]]) -> None:
        appender = _LineAppender(self.path / MEMORY_LINES_FILE)
        for row in rows:
            appender.append(row)
        appender.close()


class RankRecords:
    """One process's record files in a run folder another process created and finalises.

    A profiled script's processes (one, or one per rank under torchrun) each append their
    own step and sample lines (rank 0 keeps the plain names, see :func:`rank_file`) and end
    with ``status.rank<k>.json``; the launcher then writes ``status.json`` and the parquet
    copies through :class:`RunWriter`. Only rank 0 edits ``run.json``.
    """

    def __init__(self, path: str | os.PathLike[str], rank: int):
        self.path = Path(path)
        self.rank = rank
        self._steps = _LineAppender(
            self.path / rank_file(STEPS_LINES, rank), flush_interval_s=RECORD_FLUSH_INTERVAL_S
        )
        self._samples = _LineAppender(self.path / rank_file(SAMPLES_LINES, rank))

    def flush_if_stale(self) -> None:
        """Writes buffered step records older than the interval (the sampler calls it)."""
        with contextlib.suppress(OSError, ValueError):
            self._steps.flush_if_stale()

    def append_step(self, record: Mapping[str, Any]) -> None:
        self._steps.append(record)

    def append_steps(self, records: list[Mapping[str, Any]]) -> None:
        self._steps.extend(records)

    def append_sample(self, record: Mapping[str, Any]) -> None:
        self._samples.append(record)

    def write_status(self, status: RunState, reason: str | None, step: int, **extra: Any) -> None:
        """This process's end, read back by :meth:`RunFolder.rank_statuses`."""
        for appender in (self._steps, self._samples):
            with contextlib.suppress(OSError):
                appender.close()
        _atomic_write_json(
            self.path / RANK_STATUS_FILE.format(rank=self.rank),
            {
                "rank": self.rank,
                "status": status,
                "reason": reason,
                "step": step,
                "ended_at": time.time(),
                "pid": os.getpid(),
                "host": socket.gethostname(),
                **extra,
            },
            last_resort=True,
        )
