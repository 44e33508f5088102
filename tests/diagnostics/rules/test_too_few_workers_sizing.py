"""too-few-workers sizes its advice from the CPU actually free, and the same evidence gives
the same worker count.

The cores free for workers are the machine's less the training process's and other
processes' (medians of the system samples, which split the host's CPU); the count is the
smallest whole number within the tolerance of the headroom target, so that two runs of one
job whose medians differ by noise either side of a whole number are told the same.
"""

from __future__ import annotations

import random

import pytest

from diagnostics.rules import examples as ex
from diagnostics.rules.too_few_workers import TooFewWorkers, cores_in_use, recommend_workers
from diagnostics.thresholds import Thresholds

RULE = TooFewWorkers()
LOAD_MS, COMPUTE_MS = 60.0, 20.0  # a single-process loader: the wait is one batch's load


def _loader_bound_run(cores: int, samples: list[dict] | None, **environment):
    """40 steps waiting 60 ms for a batch loaded in the training process (0 workers)."""
    run = ex.run(
        ex.series(40, step_time_ms=LOAD_MS + COMPUTE_MS, data_wait_ms=LOAD_MS),
        config={"data.num_workers": 0, "train.batch_size": 32},
        environment={"device": "cpu", "cpu_count": cores, **environment},
        samples=samples,
    )
    return ex.inputs(run=run)


def _ticks(host_pct: float, trainer_pct: float, workers_pct: float, n: int = 20) -> list[dict]:
    return [
        {
            "wall_time": 1000.0 + 0.1 * i,
            "cpu_percent": host_pct,
            "trainer_cpu_percent": trainer_pct,
            "workers_cpu_percent": workers_pct,
            "gpu_index": None,
        }
        for i in range(n)
    ]


def _advice(inputs) -> tuple[int, str]:
    (finding,) = RULE.check(inputs, Thresholds())
    return finding.evidence["recommended_num_workers"], finding.recommendation


def test_cores_busy_with_other_processes_are_not_offered_to_workers():
    # 4 cores; the host runs 3.1 cores, the training process 1.0 of them: 2.1 are others'
    busy = _loader_bound_run(4, _ticks(host_pct=310.0, trainer_pct=100.0, workers_pct=0.0))
    idle = _loader_bound_run(4, _ticks(host_pct=100.0, trainer_pct=100.0, workers_pct=0.0))

    workers_busy, text_busy = _advice(busy)
    workers_idle, text_idle = _advice(idle)

    # the target is 1.5 x 60 / 20 = 4.5 workers; 3 idle cores allow 3, 0.9 free cores 1
    assert workers_idle == 3
    assert workers_busy == 1
    assert "2.1 of them busy with other processes" in text_busy
    assert "capped at 1" in text_busy
    (finding,) = RULE.check(busy, Thresholds())
    assert finding.evidence["cpu_cores_other_processes"] == pytest.approx(2.1)
    assert finding.evidence["worker_cap"] == 1
    assert finding.fix.config_patch == {"data.num_workers": 1}
    assert "0.0 of them busy" in text_idle


def _with_scans(ticks: list[dict], lower_priority_pct: float) -> list[dict]:
    """The sampler's priority scan on every tenth tick (once a second at 10 Hz)."""
    return [
        {**tick, "lower_priority_cpu_percent": lower_priority_pct if i % 10 == 0 else None}
        for i, tick in enumerate(ticks)
    ]


def test_cpu_of_processes_below_the_jobs_priority_is_offered_to_workers():
    # 4 cores, 2.1 of them used by other processes, 1.8 of which at a lower priority than
    # the job (a nice-19 indexer beside it): a worker takes those from them, 0.3 stay busy
    ticks = _ticks(host_pct=310.0, trainer_pct=100.0, workers_pct=0.0, n=40)
    below = _loader_bound_run(4, _with_scans(ticks, lower_priority_pct=180.0))
    unscanned = _loader_bound_run(4, ticks)

    workers_below, text_below = _advice(below)

    # 4 - 1 kept - 0.3 busy = 2.7 free cores: 2 workers of the 4.5 targeted, against 1 when
    # all 2.1 counted as busy
    assert workers_below == 2
    assert _advice(unscanned)[0] == 1
    assert "0.3 of them busy with other processes (1.8 more used by processes of a lower " in (
        text_below
    )
    (finding,) = RULE.check(below, Thresholds())
    assert finding.evidence["cpu_cores_other_processes"] == pytest.approx(0.3)
    assert finding.evidence["cpu_cores_lower_priority"] == pytest.approx(1.8)
    # the yielding part is never more than other processes used (scans and ticks are
    # medians over different windows)
    over = cores_in_use(_loader_bound_run(4, _with_scans(ticks, 250.0)).run)
    assert (over.other_processes, over.lower_priority) == (0.0, pytest.approx(2.1))


def test_fewer_than_three_priority_scans_leave_other_processes_as_measured():
    ticks = _ticks(host_pct=310.0, trainer_pct=100.0, workers_pct=0.0, n=20)
    in_use = cores_in_use(_loader_bound_run(4, _with_scans(ticks, 180.0)).run)  # two scans
    assert in_use.other_processes == pytest.approx(2.1)
    assert in_use.lower_priority is None


def test_a_run_whose_samples_do_not_split_the_cpu_says_so():
    older = _loader_bound_run(4, [{"wall_time": 1.0, "cpu_percent": 390.0, "gpu_index": None}])

    workers, text = _advice(older)

    assert workers == 3  # as before: nothing known of other processes
    assert "other processes' use not recorded" in text
    assert cores_in_use(older.run) is None


def test_one_row_per_tick_when_samples_repeat_the_host_per_gpu():
    ticks = _ticks(host_pct=250.0, trainer_pct=50.0, workers_pct=100.0, n=5)
    per_gpu = [{**row, "gpu_index": gpu} for row in ticks for gpu in (0, 1)]
    # a tick whose split is unknown (the sampler's first) is left out, not read as all others'
    per_gpu.append({"wall_time": 999.0, "cpu_percent": 400.0, "gpu_index": 0})

    in_use = cores_in_use(ex.run(samples=per_gpu))

    assert in_use is not None
    assert in_use.other_processes == pytest.approx(1.0)
    assert in_use.training_process == pytest.approx(0.5)


def test_with_workers_the_training_process_keeps_what_it_measured_using():
    # loading already in 2 workers: the training process itself used 1.8 cores
    run = ex.run(
        ex.series(40, step_time_ms=80.0, data_wait_ms=60.0),
        config={"data.num_workers": 2, "train.batch_size": 32},
        environment={"device": "cpu", "cpu_count": 8},
        samples=_ticks(host_pct=380.0, trainer_pct=180.0, workers_pct=200.0),
    )

    (finding,) = RULE.check(ex.inputs(run=run), Thresholds())

    # free: 8 - 1.8 (training process) - 0.0 (others) = 6.2 cores -> cap 6
    assert finding.evidence["worker_cap"] == 6
    assert "1.8 kept for the training process" in finding.recommendation


@pytest.mark.parametrize("target_ratio", [1.0, 2.0, 3.0])
def test_noisy_runs_of_one_job_get_one_worker_count(target_ratio):
    """Twenty runs of one job, each's per-step load and compute jittered 4 %: their medians
    fall either side of the whole-number target, and all are told the same count."""
    counts = set()
    for seed in range(20):
        rng = random.Random(seed)
        compute = [COMPUTE_MS * rng.gauss(1.0, 0.04) for _ in range(60)]
        # headroom 1.5: a load of target / 1.5 x compute asks for exactly `target` workers
        load = [COMPUTE_MS * target_ratio / 1.5 * rng.gauss(1.0, 0.04) for _ in range(60)]
        inputs = ex.cpu_run(
            60,
            step_time_ms=[c + w for c, w in zip(compute, load, strict=True)],
            data_wait_ms=load,
            config={"data.num_workers": 0, "train.batch_size": 32},
        )
        findings = RULE.check(inputs, Thresholds())
        if findings:
            counts.add(findings[0].evidence["recommended_num_workers"])
    assert counts == {max(1, round(target_ratio))}


def test_a_count_outside_the_tolerance_gets_one_more_worker():
    # a target 20 % above 2 workers is not noise: 3
    assert (
        recommend_workers(
            load_ms=24.0, compute_ms=10.0, cores=None, reserved_cores=1, tolerance_pct=10.0
        )[0]
        == 3
    )
    assert (
        recommend_workers(
            load_ms=21.0, compute_ms=10.0, cores=None, reserved_cores=1, tolerance_pct=10.0
        )[0]
        == 2
    )
