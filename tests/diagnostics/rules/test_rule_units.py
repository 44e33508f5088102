"""Edge cases of the rules and their statistics, beyond each rule's own examples."""

from __future__ import annotations

import math

import numpy as np
import polars as pl
import pytest

from diagnostics.rules import engine
from diagnostics.rules import examples as ex
from diagnostics.rules.base import Finding, Fix, Rule, Severity
from diagnostics.rules.memory_leak import MemoryLeak
from diagnostics.rules.missing_pin_memory import MissingPinMemory
from diagnostics.rules.stats import (
    increasing_share,
    robust_sigma_outliers,
    rolling_robust_z,
    theil_sen_slope,
)
from diagnostics.rules.too_few_workers import TooFewWorkers, recommend_workers
from diagnostics.rules.unstable_gradients import UnstableGradients
from diagnostics.thresholds import Thresholds

T = Thresholds()


def fired(rule: Rule, inputs) -> list[Finding]:
    if rule.skip_reason(inputs) is not None:
        return []
    return rule.check(inputs, T)


# -- statistics ------------------------------------------------------------------------


def test_theil_sen_ignores_a_fifth_of_wild_points():
    xs = list(range(50))
    ys = [3.0 * x + 7.0 for x in xs]
    for i in range(0, 50, 5):  # 10 of 50 points (20%) thrown far off
        ys[i] += 1e6
    # least squares would be dragged; the median pairwise slope stays on the line
    assert theil_sen_slope(xs, ys) == pytest.approx(3.0)


def test_rolling_robust_z_uses_only_past_values_after_warmup():
    values = [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 10.0]
    z = rolling_robust_z(values, window=32, warmup=2)
    assert all(math.isnan(v) for v in z[:5])  # fewer than 5 values of history
    # history 1.0 1.1 0.9 1.0 1.05 0.95 1.0: median 1.0, MAD 0.05 -> sigma 0.0741
    assert z[7] == pytest.approx((10.0 - 1.0) / (0.05 * 1.4826), rel=1e-6)


def test_robust_outliers_find_what_mean_plus_3_sigma_misses():
    # every 10th of 40 steps at 300 ms, the rest at 50 ms: mean 75, std 75, so
    # mean + 3 std = 300 and no step is *above* it; median 50 and MAD 0 flag the four
    times = [300.0 if s % 10 == 0 else 50.0 for s in range(1, 41)]
    arr = np.asarray(times)
    assert not (arr > arr.mean() + 3 * arr.std()).any()
    assert robust_sigma_outliers(times, 3.0).tolist() == [9, 19, 29, 39]


def test_increasing_share_counts_rising_pairs():
    # pairs of [1, 1, 2, 3, 2]: rising 1<2 x2, 1<3 x2, 1<2 x2 (last), 2<3; falling 3>2;
    # tied 1=1, 2=2: 7 of 8 differing pairs rise
    assert increasing_share([1, 1, 2, 3, 2]) == pytest.approx(7 / 8)
    assert increasing_share([5, 5, 5]) == 0.0
    # the leak run that counting neighbours got wrong: 12 rises of 17 changes (0.71)
    mib = [10.5, 2.3, 3.8, 11.1, 0.2, 8.9, 7.5, -2.8, 11.9, -2.9, 6.8, -0.9, 6.2, 11.9, 2.3]
    mib += [-3.6, 8.9, -2.8]
    series = [sum(mib[:i]) for i in range(len(mib) + 1)]
    assert increasing_share(series) >= 0.95
    # a sawtooth (the caching allocator filling and releasing) has no trend
    assert increasing_share([0, 8, 0, 8, 0, 8, 0]) == pytest.approx(0.5)


# -- too-few-workers -----------------------------------------------------------------------


def test_recommended_workers_from_load_versus_compute_capped_by_cores():
    # 40 ms to load a batch, 10 ms of compute: 4 workers deliver one batch per step
    assert recommend_workers(load_ms=40, compute_ms=10, cores=8, reserved_cores=1) == (4, 7, False)
    # 2 cores, one kept for training: a CPU-bound loader gets one worker
    assert recommend_workers(load_ms=40, compute_ms=10, cores=2, reserved_cores=1) == (1, 1, True)
    # 30 of the 40 ms are storage latency: a worker keeps a core busy a quarter of the time,
    # so the one spare core hosts 1 x 40 / 10 = 4 workers (and 200% of 2 cores allows 4)
    assert recommend_workers(load_ms=40, compute_ms=10, cores=2, reserved_cores=1, io_ms=30) == (
        4,
        4,
        False,
    )


def test_headroom_keeps_the_loader_ahead_of_compute():
    # 12 ms to load, 10 ms compute: one worker cannot keep pace, ceil(1.2) = 2
    assert recommend_workers(load_ms=12, compute_ms=10, cores=None, reserved_cores=1)[0] == 2
    # 9 ms load: one worker keeps pace exactly (0.9), with headroom 1.35 -> 2
    assert recommend_workers(load_ms=9, compute_ms=10, cores=None, reserved_cores=1)[0] == 1
    assert (
        recommend_workers(load_ms=9, compute_ms=10, cores=None, reserved_cores=1, headroom=1.5)[0]
        == 2
    )


def test_loader_bound_run_with_workers_estimates_load_from_worker_count():
    # 2 workers, 20 ms wait + 10 ms compute: each batch takes 2 x 30 = 60 ms to load,
    # so 60 / 10 = 6 workers are needed, 1.5 x 6 = 9 with the default headroom, and the
    # 8 cores leave 7
    inputs = ex.inputs(
        run=ex.run(
            ex.series(12, step_time_ms=30.0, data_wait_ms=20.0),
            config={"data": {"num_workers": 2}},
            environment=ex.CPU_ENV,
        )
    )
    (finding,) = fired(TooFewWorkers(), inputs)
    assert finding.evidence["load_ms_per_batch_estimate"] == 60.0
    assert finding.fix.config_patch == {"data.num_workers": 7}
    # now 30 ms a step; after, max(10, 60 / 7) = 10 ms: (30 - 10) / 30 saved
    assert finding.estimated_saving_pct == pytest.approx(100 * 20 / 30, abs=0.1)


def test_first_step_and_single_stalls_do_not_make_a_slow_loader():
    # the first step waits 2 s for workers to start; one later step stalls 500 ms
    wait = [2000.0] + [0.5] * 18 + [500.0]
    inputs = ex.inputs(
        run=ex.run(
            ex.series(20, step_time_ms=lambda s: 50.0 + wait[s - 1], data_wait_ms=wait),
            config={"data.num_workers": 2},
            environment=ex.CPU_ENV,
        )
    )
    assert fired(TooFewWorkers(), inputs) == []


# -- missing-pin-memory ------------------------------------------------------------------------


def test_pin_memory_skips_cpu_runs_with_the_reason():
    inputs = ex.inputs(
        run=ex.run(
            ex.series(5, step_time_ms=10.0),
            config={"data.pin_memory": False},
            environment=ex.CPU_ENV,
        )
    )
    assert "CPU" in MissingPinMemory().skip_reason(inputs)


def test_pin_memory_ignores_small_pageable_copies():
    # 5 copies of 4 KiB (scalars, shapes) = 20 KiB, far below the 1 MiB bar
    inputs = ex.inputs(
        trace=ex.trace(
            copies=[
                {
                    "direction": "HtoD",
                    "src_memory": "Pageable",
                    "dst_memory": "Device",
                    "count": 5,
                    "bytes": 5 * 4096,
                    "dur_us": 20.0,
                }
            ]
        )
    )
    assert fired(MissingPinMemory(), inputs) == []


def test_trace_with_pinned_copies_outweighs_a_pageable_config():
    inputs = ex.inputs(
        trace=ex.trace(
            copies=[
                {
                    "direction": "HtoD",
                    "src_memory": "Pinned",
                    "dst_memory": "Device",
                    "count": 5,
                    "bytes": 2**26,
                    "dur_us": 2000.0,
                }
            ]
        ),
        run=ex.run(
            ex.series(5, step_time_ms=10.0, cuda_allocated_bytes=2**30),
            config={"data.pin_memory": False},
            environment=ex.CUDA_ENV,
        ),
    )
    assert fired(MissingPinMemory(), inputs) == []


# -- unstable-gradients ----------------------------------------------------------------------


def _grad_run(n, grad_norm, loss=1.0, **kwargs):
    return ex.inputs(
        run=ex.run(
            ex.series(n, grad_norm=grad_norm, loss=loss, **kwargs),
            environment=kwargs.pop("environment", ex.CPU_ENV),
        )
    )


def test_spikes_inside_warmup_are_ignored():
    # norms settle from 50 to 1 over the first 10 steps: all inside ZClip's 25-step warm-up
    inputs = _grad_run(60, lambda s: 50.0 / s if s <= 10 else 1.0 + 0.01 * (s % 3))
    assert fired(UnstableGradients(), inputs) == []


def test_each_phase_is_judged_on_its_own():
    # pretraining norms ~10, fine-tuning norms ~1: the switch is not a spike
    phase = ["pretrain"] * 40 + ["finetune"] * 40
    inputs = ex.inputs(
        run=ex.run(
            ex.series(
                80,
                phase=phase,
                loss=1.0,
                grad_norm=lambda s: (10.0 if s <= 40 else 1.0) * (1 + 0.02 * (s % 4)),
            ),
            environment=ex.CPU_ENV,
        )
    )
    assert fired(UnstableGradients(), inputs) == []


def test_grad_scaler_overflow_steps_are_scaling_not_non_finite():
    # fp16 with a scaler: step 30 overflows (inf norm) and the scale halves once: normal
    scale = [65536.0] * 30 + [32768.0] * 30
    inputs = _grad_run(60, lambda s: math.inf if s == 30 else 1.0 + 0.01 * (s % 3), amp_scale=scale)
    assert fired(UnstableGradients(), inputs) == []


def test_frequent_scaler_skips_after_warmup_fire_with_the_steps():
    # the scale halves at every 4th step after step 30: 8 skips in 35 judged steps (23%)
    scale, value = [], 2.0**16
    for s in range(1, 61):
        scale.append(value)
        if s >= 30 and s % 4 == 0:
            value /= 2
    inputs = _grad_run(60, 1.0, amp_scale=scale)
    (finding,) = fired(UnstableGradients(), inputs)
    skipped = finding.evidence["scaler_skipped_steps"]["all"]
    assert skipped["steps"] == [s for s in range(26, 61) if s >= 30 and s % 4 == 0 and s < 60]
    assert "scaler_skipped_steps" in finding.evidence["signals"]


def test_divergence_is_found_from_the_loss_alone():
    # loss falls to 1.0 then climbs to 5: last 10-step median 4x the best
    inputs = _grad_run(50, 1.0, loss=lambda s: max(1.0, 3.0 - s * 0.1) if s <= 30 else s / 10)
    (finding,) = fired(UnstableGradients(), inputs)
    div = finding.evidence["divergence"]["all"]
    assert div["best_windowed_loss"] == pytest.approx(1.0)
    assert div["ratio"] > 2.0


def test_fp16_config_without_scaler_only_counts_on_cuda():
    cfg = {"train": {"amp": "fp16", "grad_scaler": False, "lr": 1e-3}}
    cpu = ex.inputs(
        run=ex.run(ex.series(30, grad_norm=1.0, loss=1.0), config=cfg, environment=ex.CPU_ENV)
    )
    assert fired(UnstableGradients(), cpu) == []
    cuda = ex.inputs(
        run=ex.run(
            ex.series(30, grad_norm=1.0, loss=1.0, cuda_allocated_bytes=2**30),
            config=cfg,
            environment=ex.CUDA_ENV,
        )
    )
    (finding,) = fired(UnstableGradients(), cuda)
    assert finding.fix.config_patch == {"train.grad_scaler": True}


def test_bf16_kernels_need_no_scaler():
    inputs = ex.inputs(
        trace=ex.trace(
            kernels=[
                {
                    "name": "ampere_bf16_s16816gemm_bf16_128x128",
                    "calls": 10,
                    "device_us": 5000.0,
                    "mean_us": 500.0,
                    "tensor_core": True,
                    "fp16": True,
                }
            ]
        )
    )
    assert fired(UnstableGradients(), inputs) == []


def test_lr_patch_is_a_tenth_and_never_above_adamw_default():
    def run(lr):
        return ex.inputs(
            run=ex.run(
                ex.series(35, loss=lambda s: math.nan if s > 30 else 1.0, grad_norm=1.0),
                config={"train.lr": lr},
                environment=ex.CPU_ENV,
            )
        )

    (a,) = fired(UnstableGradients(), run(40.0))
    assert a.fix.config_patch == {"train.grad_clip": 1.0, "train.lr": 0.001}
    (b,) = fired(UnstableGradients(), run(5e-4))
    assert b.fix.config_patch == {"train.grad_clip": 1.0, "train.lr": 5e-5}


# -- memory-leak --------------------------------------------------------------------------


def test_leak_survives_noise_spikes_and_projects_steps_to_oom():
    # +2 MiB a step from 1 GiB, every 4th step a transient +50 MiB (25% outliers)
    mib = 2**20

    def rss(s):
        return 1024 * mib + 2 * s * mib + (50 * mib if s % 4 == 0 else 0)

    inputs = ex.inputs(
        run=ex.run(
            ex.series(60, rss_bytes=rss), environment={**ex.CPU_ENV, "memory_total_bytes": 2**31}
        )
    )
    (finding,) = fired(MemoryLeak(), inputs)
    assert finding.evidence["slope_bytes_per_step"] == pytest.approx(2 * mib, rel=0.01)
    # last value (step 60, a spike step): 1024 + 120 + 50 = 1194 MiB of 2048 MiB, at 2 MiB
    # a step: (2048 - 1194) / 2 = 427 steps
    assert finding.evidence["projected_steps_to_oom"] == pytest.approx(427, abs=2)


def test_one_jump_after_warmup_is_not_a_leak():
    # flat at 800 MiB with +-64 KiB noise, one 100 MiB jump at step 30 (a cache filled once)
    def rss(s):
        return (800 + (100 if s >= 30 else 0)) * 2**20 + ((s * 37) % 7 - 3) * 2**16

    inputs = ex.inputs(run=ex.run(ex.series(60, rss_bytes=rss), environment=ex.CPU_ENV))
    assert fired(MemoryLeak(), inputs) == []


# -- engine ----------------------------------------------------------------------------------


class _Broken(Rule):
    id = "broken"
    title = "always raises"
    severity = Severity.LOW

    def check(self, inputs, thresholds):
        raise RuntimeError("boom")


class _Always(Rule):
    id = "always"
    title = "always fires"
    severity = Severity.HIGH

    def check(self, inputs, thresholds):
        return [Finding(self.id, self.severity, "t", {"steps": []}, "r", Fix(code=""))]


def test_a_broken_rule_is_reported_and_the_others_still_run(monkeypatch):
    monkeypatch.setattr(engine, "RULES", (_Broken(), _Always()))
    outcome = engine.run_rules(ex.inputs())
    assert [f.rule for f in outcome.findings] == ["always"]
    assert [(e.rule, e.reason) for e in outcome.errors] == [("broken", "RuntimeError: boom")]


def test_leak_points_at_allocating_lines_not_function_headers():
    # memory_profiler puts the process's memory at entry (700 MiB) on the `def` line; the
    # allocation that stays is the forward pass line (+150 MiB over 50 calls)
    lines = [
        {
            "function": "train_step",
            "filename": "loop.py",
            "line": 30,
            "mem_usage_mib": 700.0,
            "increment_mib": 700.0,
            "occurrences": 50,
            "source": "    def train_step(self, batch):",
        },
        {
            "function": "train_step",
            "filename": "loop.py",
            "line": 42,
            "mem_usage_mib": 850.0,
            "increment_mib": 150.0,
            "occurrences": 50,
            "source": "        out = self.model(batch)",
        },
        {
            "function": "train_step",
            "filename": "loop.py",
            "line": 43,
            "mem_usage_mib": 850.0,
            "increment_mib": 0.0,
            "occurrences": 50,
            "source": "        total += out.loss",
        },
    ]
    inputs = ex.inputs(
        run=ex.run(
            ex.series(40, rss_bytes=lambda s: 800 * 2**20 + 4 * 2**20 * s),
            environment=ex.CPU_ENV,
            memory_lines=lines,
        )
    )
    (finding,) = fired(MemoryLeak(), inputs)
    assert [line["line"] for line in finding.evidence["memory_lines"]] == [42]
    assert "line 42" in finding.recommendation


def test_low_utilisation_learns_which_related_findings_fired():
    # the GPU idles mostly while the host waits for the DataLoader, and the DataLoader rule
    # fires on the same trace: the utilisation finding says it is explained by it
    gaps = [
        {
            "device": 0,
            "stream": 7,
            "start_us": 0.0,
            "end_us": 30_000.0,
            "dur_us": 30_000.0,
            "idle_kind": "host_wait",
            "host_activity": "dataloader",
        }
    ]
    trace = ex.trace(
        gpu=[{"device": 0, "busy_us": 15_000.0, "span_us": 50_000.0, "utilization_pct": 30.0}],
        idle_gaps=gaps,
        breakdown=ex.breakdown_rows(5, kernel=3000.0, dataloader=6000.0, cpu_exec=1000.0),
    )
    outcome = engine.run_rules(ex.inputs(trace=trace))
    low = next(f for f in outcome.findings if f.rule == "low-gpu-utilization")
    assert low.evidence["related_rules"] == ["too-few-workers"]
    assert low.evidence["explained_by_findings"] == ["too-few-workers"]


def test_idle_by_kind_lists_the_largest_share_first_on_every_run():
    # polars' group_by does not keep an order: the evidence (and the CLI's JSON) changed
    # key order between identical runs
    from diagnostics.rules.low_gpu_utilization import LowGpuUtilization

    kinds = ["other", "host_wait", "kernel_wait", "other", "host_wait", "host_wait"]
    gaps = pl.DataFrame({"idle_kind": kinds * 2000, "dur_us": [10.0] * 12000})
    seen = {tuple(LowGpuUtilization._idle_kinds(gaps).items()) for _ in range(30)}
    assert seen == {(("host_wait", 50.0), ("other", 33.3), ("kernel_wait", 16.7))}
