"""too-few-workers: the step waits for the DataLoader.

What it finds
    Steps that spend more than a threshold share of their time blocked in
    ``next(dataloader_iter)``. The share is the data-wait share of the key metrics (the
    median over steady-state steps of each step's wait / step time, the figure on the cards
    and in the reports): from the per-step ``data_wait_ms`` records of a run (the first step
    of each phase, whose wait includes starting the workers, left out), or from the
    DataLoader ranges (``enumerate(DataLoader)#...__next__``) inside a trace's profiler steps.

    A wait can also be a batch that was loaded in time but took long to reach the training
    process (on a loaded host, each of its tensors handed over through shared memory). More
    workers cannot shorten that. Where the step records say how much of each wait the batch
    was still loading (``loading_wait_ms``: the trainer stamps each batch at the end of its
    collate), the share of that part must pass the threshold; the title still quotes the
    whole wait, the figure on the cards.

Why it matters
    While the training process waits for a batch, the accelerator and the optimiser do
    nothing. Loading in worker processes overlaps it with compute; with ``num_workers=0``
    every sample is read and tokenised in the training loop itself.

How to fix
    Raise ``num_workers``. The recommended count comes from the evidence: the time to load
    one batch (with ``w`` workers a loader-bound step takes ``load / w``; with none, the wait
    *is* the load) over the compute time of a step, so that the workers together produce a
    batch per step; a whole count within a tolerance of that target is taken as it is, so
    that medians a little either side of a whole number give the same advice. It is capped
    by the cores actually free: the machine's, less those the training process keeps (one,
    or what it measured using once the loading is in workers) and those other processes
    used (medians of the system samples, which split the host's CPU into the training
    process's, its workers' and the rest; where they do not, the text says other processes
    were not recorded). Of other processes' use, what processes of a lower priority used
    is left out, weighed as the scheduler weighs them: a worker of the job takes that CPU
    from them (a nice-19 indexer beside a nice-0 job, a nice-0 build beside a job raised
    to nice -15). Only the CPU part of a worker's time counts when the storage latency
    is known from the config or measured (a worker sleeping on I/O does not occupy a core),
    and never above SageMaker's 200% of cores. Keep workers alive between epochs with
    ``persistent_workers=True``.

    On a script run (``pipeline-doctor profile``) the finding names the line that built
    the DataLoader the step waited on, with its actual arguments, rewrites that call, and
    gives the patch as ``--override`` keys (``dataloader.num_workers``), so the script can
    be re-run with the fix unedited.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import polars as pl

from diagnostics.metrics import median_share_pct, steady_steps
from diagnostics.model import AnalysisInputs
from diagnostics.percent import pct
from diagnostics.rules import examples as ex
from diagnostics.rules import script_loaders
from diagnostics.rules.base import (
    Example,
    Finding,
    Fix,
    Need,
    Rule,
    Severity,
    need_any,
    need_run_steps,
)
from diagnostics.rules.evidence import (
    chart,
    config_count,
    config_value,
    cpu_count,
    has_steps,
    numeric,
    r,
)
from diagnostics.rules.stats import median
from diagnostics.sources import RunData
from diagnostics.thresholds import Thresholds

# SageMaker Debugger's Dataloader rule wants workers between 70% and 200% of the cores.
MAX_WORKERS_PER_CORE = 2.0
# A trace's DataLoader range names the iterator class, which tells whether workers run.
SINGLE_PROCESS_ITER = "_SingleProcessDataLoaderIter"
MULTI_PROCESS_ITER = "_MultiProcessingDataLoaderIter"
# system samples (ticks) that must split the host's CPU before other processes' use counts
MIN_CPU_TICKS = 3

FIX_CODE = """\
# before: every batch is loaded inside the training loop
loader = DataLoader(dataset, batch_size=32, num_workers=0)

# after: {workers} worker processes load batches while the model trains
loader = DataLoader(
    dataset, batch_size=32, num_workers={workers},
    persistent_workers=True,  # keep workers between epochs
    prefetch_factor=2,        # batches each worker keeps ready
)
"""


@dataclass(frozen=True)
class CoresInUse:
    """Cores busy outside the DataLoader workers, medians over the run's system samples:
    other processes (the host's CPU less the training process's and its workers', less
    what of it yields to the job) and the training process itself. ``lower_priority``:
    other processes' CPU that yields to the job (None where the samples do not say)."""

    other_processes: float
    training_process: float
    lower_priority: float | None = None


def cores_in_use(run: RunData | None) -> CoresInUse | None:
    """None where the samples do not split the host's CPU (a bare trace, an older run)."""
    if run is None or run.samples.height == 0:
        return None
    columns = ("cpu_percent", "trainer_cpu_percent", "workers_cpu_percent")
    if any(name not in run.samples.columns for name in columns):
        return None
    # one row per GPU per tick: the host's figures repeat on each
    ticks = run.samples.filter(
        pl.all_horizontal(pl.col(name).is_not_null() for name in columns)
    ).unique("wall_time", keep="first", maintain_order=True)
    if ticks.height < MIN_CPU_TICKS:
        return None
    other = (
        pl.col("cpu_percent") - pl.col("trainer_cpu_percent") - pl.col("workers_cpu_percent")
    ).clip(lower_bound=0.0).median() / 100.0
    trainer = pl.col("trainer_cpu_percent").median() / 100.0
    row = ticks.select(other.alias("other"), trainer.alias("trainer")).row(0)
    other_cores, training_cores = float(row[0]), float(row[1])
    lower = _lower_priority_cores(run.samples)
    if lower is None:
        return CoresInUse(other_processes=other_cores, training_process=training_cores)
    # a worker of the job takes those cores from the processes below it: they are free
    return CoresInUse(
        other_processes=max(0.0, other_cores - lower),
        training_process=training_cores,
        lower_priority=min(lower, other_cores),
    )


def _lower_priority_cores(samples: pl.DataFrame) -> float | None:
    """Median of the priority scans (one a second), in cores; None with too few of them."""
    if "lower_priority_cpu_percent" not in samples.columns:
        return None
    scans = samples.filter(pl.col("lower_priority_cpu_percent").is_not_null()).unique(
        "wall_time", keep="first", maintain_order=True
    )
    if scans.height < MIN_CPU_TICKS:
        return None
    return float(scans["lower_priority_cpu_percent"].median()) / 100.0


def recommend_workers(
    *,
    load_ms: float,
    compute_ms: float,
    cores: int | None,
    reserved_cores: float,
    io_ms: float = 0.0,
    headroom: float = 1.0,
    busy_cores: float = 0.0,
    tolerance_pct: float = 0.0,
) -> tuple[int, int | None, bool]:
    """(recommended workers, core cap or None, capped?) for one batch load and one step.

    ``needed`` workers deliver a batch per compute step, with ``headroom`` to spare; a
    whole count within ``tolerance_pct`` of that target is taken as it is, so that medians
    a little either side of a whole number do not flip the advice. Each worker keeps a
    core busy for the CPU part of its load (``load - io``) only, so the cores free for
    the workers (those left after the training process and ``busy_cores`` used by other
    processes) can host ``free x load / cpu_load`` of them.
    """
    target = headroom * load_ms / max(compute_ms, 1e-6)
    needed = max(1, math.ceil(target / (1.0 + tolerance_pct / 100.0) - 1e-9))
    if cores is None:
        return needed, None, False
    free = max(0.0, max(1.0, cores - reserved_cores) - busy_cores)
    cpu_ms = max(load_ms - io_ms, 0.0)
    by_duty_cycle = math.inf if cpu_ms <= 0 else free * load_ms / cpu_ms
    cap = max(1, int(min(by_duty_cycle, MAX_WORKERS_PER_CORE * cores) + 1e-9))
    return min(needed, cap), cap, needed > cap


def _configured_workers(inputs: AnalysisInputs) -> int | None:
    """The run's loader's worker count, else what the trace's DataLoader ranges say."""
    workers = _workers(inputs)
    return workers if workers is not None else _current_workers_from_events(inputs)


def _current_workers_from_events(inputs: AnalysisInputs) -> int | None:
    """0 when the trace's DataLoader ranges come from the single-process iterator."""
    events = inputs.events
    if events is None or "name" not in events.columns or events.height == 0:
        return None
    names = events.filter(pl.col("name").str.contains("DataLoader", literal=True))["name"]
    if names.is_empty():
        return None
    if names.str.contains(SINGLE_PROCESS_ITER, literal=True).any():
        return 0
    return None


def _workers(inputs: AnalysisInputs) -> int | None:
    """The loader's worker count: a script run's own DataLoader, else the trainer config."""
    loader = script_loaders.training_loader(inputs.run)
    if script_loaders.is_script_run(inputs.run):
        return loader.num_workers if loader is not None else None
    return config_count(inputs.run, "data.num_workers")


def _measured_io_ms(inputs: AnalysisInputs, load_ms: float) -> float | None:
    """A script run's loader without workers: the part of one batch's load that was not the
    training thread's CPU time (I/O, sleeps), measured in ``__next__``; a worker waiting on
    it does not occupy a core. None where not measured."""
    if not script_loaders.is_script_run(inputs.run):
        return None
    loader = script_loaders.training_loader(inputs.run)
    if loader is None or loader.num_workers or not loader.wait_ms or loader.wait_cpu_ms is None:
        return None
    return load_ms * max(0.0, 1.0 - loader.wait_cpu_ms / loader.wait_ms)


def _cap_text(
    cores: int | None, cap: int | None, capped: bool, in_use: CoresInUse | None, main: float
) -> str:
    if cores is None or cap is None:
        return "CPU count unknown: do not exceed the cores you can spare"
    if in_use is None:
        cores_text = f"{cores} CPU cores (other processes' use not recorded)"
    else:
        lower = in_use.lower_priority
        yielding = (
            f" ({lower:.1f} more used by processes of a lower priority, which yield to it)"
            if lower is not None and lower >= 0.05
            else ""
        )
        cores_text = (
            f"{cores} CPU cores, {in_use.other_processes:.1f} of them busy with other "
            f"processes{yielding} and {main:.1f} kept for the training process"
        )
    return f"capped at {cap} by {cores_text}" if capped else f"{cores_text}, allow {cap}"


class TooFewWorkers(Rule):
    id = "too-few-workers"
    title = "The training step waits for the DataLoader"
    severity = Severity.HIGH
    needs = (
        need_any(
            need_run_steps("data_wait_ms", "step_time_ms"),
            Need(
                "a trace's DataLoader time per step",
                lambda inputs: (
                    inputs.trace is not None
                    and inputs.trace.host_side
                    and inputs.trace.breakdown.height > 0
                    and "dataloader_us" in inputs.trace.breakdown.columns
                ),
            ),
            text="run step records with data_wait_ms and step_time_ms, or a trace's DataLoader time",
            skip="no DataLoader timing: needs run step records with data_wait_ms or trace steps",
        ),
    )
    threshold_names = (
        "dataloader_share_min_pct",
        "dataloader_wait_min_ms",
        "cores_reserved_for_main",
        "worker_headroom",
        "worker_count_tolerance_pct",
    )

    def check(self, inputs: AnalysisInputs, thresholds: Thresholds) -> list[Finding]:
        if has_steps(inputs.run, "data_wait_ms", "step_time_ms"):
            measured = self._from_run(inputs)
        else:
            measured = self._from_trace(inputs)
        if measured is None:
            return []
        # where the records say how much of the wait was loading, that part decides: the
        # rest was handing loaded batches over, which more workers cannot shorten
        share_pct = measured.get("loading_share_pct", measured["wait_share_pct"])
        if share_pct is None or share_pct < thresholds.dataloader_share_min_pct:
            return []
        wait_ms = measured.get("loading_ms_median", measured["wait_ms_median"])
        if wait_ms < thresholds.dataloader_wait_min_ms:
            return []
        return [self._finding(inputs, measured, thresholds)]

    def _from_run(self, inputs: AnalysisInputs) -> dict[str, Any] | None:
        assert inputs.run is not None
        # the steady steps the key metrics are over: the share and the median step quoted
        # here are the ones on the cards and in the reports
        steady = steady_steps(inputs.run.steps).filter(pl.col("data_wait_ms").is_not_null())
        if steady.height == 0:
            return None
        wait = numeric(steady, "data_wait_ms")
        total = numeric(steady, "step_time_ms")
        compute = [t - w for t, w in zip(total, wait, strict=True)]
        measured = {
            "source": "run step records (data wait / step time, steady-state steps)",
            "wait_share_pct": inputs.metrics.data_wait_pct,
            "wait_ms_median": median(wait),
            "step_ms_median": inputs.metrics.median_step_time_ms,
            "compute_ms_median": median(compute),
            "steps": steady["step"].to_list(),
            "wait_ms": wait,
            "other_ms": compute,
            "num_workers": _configured_workers(inputs),
        }
        if "loading_wait_ms" in steady.columns:
            loading = steady.filter(pl.col("loading_wait_ms").is_not_null())
            # every steady step stamped, or the loading share would be over other steps
            if loading.height == steady.height:
                measured["loading_share_pct"] = median_share_pct(
                    loading["loading_wait_ms"], loading["step_time_ms"]
                )
                measured["loading_ms_median"] = median(numeric(loading, "loading_wait_ms"))
        return measured

    def _from_trace(self, inputs: AnalysisInputs) -> dict[str, Any] | None:
        trace = inputs.trace
        assert trace is not None
        frame = trace.breakdown
        if frame.height == 0:
            return None
        wait_ms = [v / 1000 for v in numeric(frame, "dataloader_us")]
        total_ms = [v / 1000 for v in numeric(frame, "total_us")]
        compute = [t - w for t, w in zip(total_ms, wait_ms, strict=True)]
        workers = _configured_workers(inputs)
        return {
            "source": "trace DataLoader ranges inside profiler steps",
            "wait_share_pct": median_share_pct(frame["dataloader_us"], frame["total_us"]),
            "wait_ms_median": median(wait_ms),
            "step_ms_median": inputs.metrics.median_step_time_ms or median(total_ms),
            "compute_ms_median": median(compute),
            "steps": frame["step"].to_list(),
            "wait_ms": wait_ms,
            "other_ms": compute,
            "num_workers": workers,
        }

    def _finding(
        self, inputs: AnalysisInputs, m: dict[str, Any], thresholds: Thresholds
    ) -> Finding:
        workers = m["num_workers"]
        wait, compute = m["wait_ms_median"], max(m["compute_ms_median"], 1e-6)
        # one batch's load time: with w workers a loader-bound step lasts load / w
        load = wait if not workers else workers * (wait + compute)
        batch = config_value(inputs.run, "train.batch_size")
        latency = config_value(inputs.run, "data.sample_latency_ms")
        io_ms = 0.0
        if isinstance(batch, int) and isinstance(latency, int | float):
            io_ms = min(load, float(latency) * batch)
        measured_io_ms = _measured_io_ms(inputs, load)
        if measured_io_ms is not None:
            io_ms = measured_io_ms
        cores = cpu_count(inputs)
        in_use = cores_in_use(inputs.run)
        # the training process keeps its reserved cores, or what it measured using when the
        # loading is already in workers (without workers its CPU includes the loading,
        # which moves to them)
        main_cores = float(thresholds.cores_reserved_for_main)
        if in_use is not None and workers:
            main_cores = max(main_cores, in_use.training_process)
        recommended, cap, capped = recommend_workers(
            load_ms=load,
            compute_ms=compute,
            cores=cores,
            reserved_cores=main_cores,
            io_ms=io_ms,
            headroom=thresholds.worker_headroom,
            busy_cores=in_use.other_processes if in_use is not None else 0.0,
            tolerance_pct=thresholds.worker_count_tolerance_pct,
        )
        at_cap = bool(workers) and cap is not None and int(workers) >= cap
        if workers:
            # more workers than now, even at the core cap: the wait is measured, and the
            # recommendation says the cores are the limit
            recommended = max(recommended, int(workers) + 1)
        step_now = wait + compute
        step_after = max(compute, load / recommended)
        # workers can hide the wait at most: the cap keeps the medians' estimate consistent
        # with the measured share
        saving_pct = min(
            max(0.0, 100.0 * (step_now - step_after) / step_now),
            m.get("loading_share_pct", m["wait_share_pct"]),
        )
        share = m["wait_share_pct"]
        hideable = m.get("loading_share_pct", share)
        severity = (
            Severity.HIGH
            if hideable >= 4 * thresholds.dataloader_share_min_pct
            else Severity.MEDIUM
        )
        worker_text = "unknown" if workers is None else str(workers)
        cap_text = _cap_text(cores, cap, capped, in_use, main_cores)
        evidence = {
            "source": m["source"],
            "data_wait_share_pct": r(share, 1),
            "data_wait_ms_median": r(wait),
            # of the wait, the batch still loading (the rest: a loaded batch handed over)
            "loading_wait_share_pct": r(m.get("loading_share_pct"), 1),
            "loading_wait_ms_median": r(m.get("loading_ms_median")),
            "compute_ms_median": r(compute),
            # the key metrics' own values, unrounded: rounded twice they could read one
            # digit apart from the cards
            "step_time_ms_median": m["step_ms_median"],
            "throughput_samples_per_s": inputs.metrics.samples_per_s,
            "load_ms_per_batch_estimate": r(load),
            "io_ms_per_batch_from_config": r(io_ms) if io_ms and measured_io_ms is None else None,
            "io_ms_per_batch_measured": r(measured_io_ms) if measured_io_ms is not None else None,
            "num_workers": workers,
            "cpu_count": cores,
            # medians over the system samples; None where they do not split the host's CPU
            "cpu_cores_other_processes": r(in_use.other_processes, 2) if in_use else None,
            "cpu_cores_training_process": r(in_use.training_process, 2) if in_use else None,
            # other processes' CPU left out of the cap: theirs yields to the training process
            "cpu_cores_lower_priority": (
                r(in_use.lower_priority, 2)
                if in_use and in_use.lower_priority is not None
                else None
            ),
            "worker_cap": cap,
            "recommended_num_workers": recommended,
            "threshold_pct": thresholds.dataloader_share_min_pct,
            "steps": [m["steps"][0], m["steps"][-1]],
            "chart": chart(
                "bar",
                "DataLoader wait per step",
                "step",
                "time (ms)",
                m["steps"],
                {"data wait (ms)": m["wait_ms"], "rest of step (ms)": m["other_ms"]},
            ),
        }
        loader = script_loaders.training_loader(inputs.run)
        # the HF Trainer's loader takes its arguments from TrainingArguments' dataloader_*
        knob = (
            script_loaders.HF_TRAINING_ARGUMENTS
            if loader is not None and script_loaders.built_by_hf_trainer(loader)
            else {"num_workers": "num_workers", "persistent_workers": "persistent_workers"}
        )
        recommendation = (
            f"The step waits {wait:.1f} ms (median) for each batch while compute takes "
            f"{compute:.1f} ms; num_workers is {worker_text}. Loading one batch takes "
            f"about {load:.1f} ms, so {recommended} worker(s) would deliver a batch per "
            f"step ({cap_text}). Set {knob['num_workers']}={recommended} with "
            f"{knob['persistent_workers']}=True."
            + (
                f" The {workers} worker(s) already use the cores this machine can spare, "
                "so also make loading cheaper (pre-tokenise, cache) or batches larger."
                if at_cap
                else ""
            )
        )
        fix = Fix(
            code=FIX_CODE.format(workers=recommended),
            config_patch={"data.num_workers": recommended},
        )
        if script_loaders.is_script_run(inputs.run) and loader is not None:
            assert inputs.run is not None
            change = {"num_workers": recommended, "persistent_workers": True}
            recommendation = f"{script_loaders.built_with(loader)}. {recommendation}"
            fix = Fix(
                code=script_loaders.fix_code(
                    loader, change, f"{recommended} worker processes load batches meanwhile"
                ),
                config_patch=script_loaders.config_patch({"num_workers": recommended}),
            )
            evidence["dataloader"] = {
                "site": loader.site,
                "code": loader.code,
                "dataset_class": loader.dataset_class,
                "built_by": loader.built_by,
                **{name: getattr(loader, name) for name in loader.ARGUMENTS},
            }
            evidence["rerun_command"] = script_loaders.rerun_command(
                inputs.run, {"num_workers": recommended}
            )
        return Finding(
            rule=self.id,
            severity=severity,
            title=f"{pct(share)} of step time is spent waiting for the DataLoader",
            evidence=evidence,
            recommendation=recommendation,
            fix=fix,
            estimated_saving_pct=r(saving_pct, 1),
        )

    examples: ClassVar = (
        Example(
            "run: 40 ms of an 50 ms step waits on a single-process loader",
            True,
            lambda: ex.cpu_run(
                20,
                step_time_ms=50.0,
                data_wait_ms=40.0,
                config={"data.num_workers": 0, "train.batch_size": 32},
            ),
        ),
        Example(
            "run: 40 ms of a 50 ms step waits, 38 ms of it for the batch to finish loading",
            True,
            lambda: ex.cpu_run(
                20,
                step_time_ms=50.0,
                data_wait_ms=40.0,
                loading_wait_ms=38.0,
                config={"data.num_workers": 1, "train.batch_size": 32},
            ),
        ),
        Example(
            "run: 6 ms of an 80 ms step waits, each batch loaded before it was asked for",
            False,
            lambda: ex.cpu_run(
                20,
                step_time_ms=80.0,
                data_wait_ms=6.0,
                loading_wait_ms=0.0,
                config={"data.num_workers": 1, "train.batch_size": 32},
            ),
        ),
        Example(
            "run: 0.2 ms of a 50 ms step waits: workers keep up",
            False,
            lambda: ex.cpu_run(
                20, step_time_ms=50.0, data_wait_ms=0.2, config={"data.num_workers": 4}
            ),
        ),
        Example(
            "trace: DataLoader ranges take 30% of each profiler step",
            True,
            lambda: ex.inputs(
                trace=ex.trace(breakdown=ex.breakdown_rows(5, kernel=7000.0, dataloader=3000.0))
            ),
        ),
        Example(
            "trace: DataLoader ranges take 1% of each step",
            False,
            lambda: ex.inputs(
                trace=ex.trace(breakdown=ex.breakdown_rows(5, kernel=9900.0, dataloader=100.0))
            ),
        ),
    )
