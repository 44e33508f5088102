"""CUDA paths: CUDA-event timing, AMP with GradScaler, CUDA memory stats, NVML sampling,
steps without a device sync, the profiler's teardown, the size presets and fp32.

Run only where CUDA exists (``scripts/gpu_check.sh`` runs them with a profiled run of every
scenario); everywhere else they are skipped by the marker's skipif. The parts that do not
need a device are tested on CPU (test_deferred.py, test_sizes.py, test_gpu_check.py) and on
the H200 run folders in ../shared/gpu-runs (tests/diagnostics/rules/test_gpu_runs.py, and
test_gpu_trace_steps.py for the profiler-step assertion below).
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
import time
import warnings
from pathlib import Path

import polars as pl
import pytest
import torch
from torch_tb_profiler.profiler.data import RunProfileData

from diagnostics.runs import RunFolder, RunWriter
from tests.conftest import run_trainer_cli
from trainer.config import ProfilerConfig, build_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

GPU_ARGS = [
    "--device",
    "cuda",
    "--steps",
    "8",
    "--set",
    "data.rows=600",
    "--set",
    "train.pretrain_steps=2",
    "--set",
    "train.checkpoint_every=4",
]


def _run(tmp_path, *extra):
    result = run_trainer_cli(["run", "--runs-dir", str(tmp_path), *GPU_ARGS, *extra])
    assert result.returncode == 0, result.stderr[-3000:]
    return RunFolder(result.stdout.strip().splitlines()[-1])


def test_cuda_event_clock_times_gpu_work_not_the_launch():
    from probe.steps import CudaStepClock

    host = torch.ones(64 * 2**20 // 4).pin_memory()
    # Warm up first. On an H200 with PyTorch 2.11 the first torch.cuda._sleep launch took
    # 11.6 ms on the host: the first launch of a kernel loads its module (lazy loading,
    # CUDA_MODULE_LOADING=LAZY by default), so it is not a launch but a load. A step clock
    # only ever times steady launches.
    for _ in range(2):
        torch.cuda._sleep(1000)
        host.to("cuda", non_blocking=True)
        torch.cuda.Event(enable_timing=True).record()
    torch.cuda.synchronize()

    clock = CudaStepClock()
    clock.begin()
    clock.mark("fetched")
    clock.mark("start")
    host.to("cuda", non_blocking=True)
    clock.mark("copied")
    launched = time.perf_counter()
    torch.cuda._sleep(200_000_000)  # a kernel that spins ~0.1 s or more on any GPU
    launch_ms = (time.perf_counter() - launched) * 1e3
    clock.mark("computed")
    pending = clock.finish()
    finished_ms = (time.perf_counter() - launched) * 1e3
    # finish() did not wait for the kernel: the host is back long before it ends
    assert not pending.ready()
    pending.wait()
    times = pending.get()
    # the host only queued the kernel; the events saw it run
    assert times["compute_ms"] > 10 * launch_ms
    assert times["compute_ms"] > 20.0
    assert times["compute_ms"] > 5 * finished_ms
    assert times["h2d_ms"] > 0.0  # 64 MiB over PCIe/NVLink takes measurable time
    # the step is the device's span from its first mark to its last
    assert times["step_time_ms"] >= times["h2d_ms"] + times["compute_ms"]


def test_amp_fp16_with_grad_scaler_records_scale_and_cuda_memory(tmp_path):
    run = _run(tmp_path, "--set", "train.amp=fp16", "--set", "train.grad_scaler=true")
    steps = run.steps()
    assert run.status().status == "completed"
    assert run.manifest().environment["device"] == "cuda"
    assert run.manifest().environment["gpu_name"]
    # the total the memory rules project against: the device the run trained on
    total = torch.cuda.get_device_properties(0).total_memory
    assert run.manifest().environment["gpu_memory_bytes"] == total
    assert (steps["cuda_peak_bytes"] < total).all()
    # GradScaler starts at 2**16 and only halves on overflow or doubles after 2000 steps
    scales = steps["amp_scale"].to_list()
    assert all(s is not None and s <= 2.0**16 for s in scales)
    assert (steps["cuda_allocated_bytes"] > 0).all()
    assert (steps["cuda_reserved_bytes"] >= steps["cuda_allocated_bytes"]).all()
    assert (steps["cuda_peak_bytes"] >= steps["cuda_allocated_bytes"]).all()
    assert steps["loss"].is_finite().all()


def assert_three_profiled_steps(trace: Path, tmp_path: Path) -> None:
    """The default window's three steps, as torch-tb-profiler and the trace itself see them.

    Current traces carry each ProfilerStep#N twice: on the CPU (user_annotation) and on the
    GPU timeline (gpu_user_annotation), and torch-tb-profiler 0.4.3 lists both (six names
    for three steps on the H200). So: three distinct step numbers, three CPU-side spans.
    """
    profile = RunProfileData.parse("worker0", "span", str(trace), str(tmp_path))
    assert profile.has_kernel
    assert len(set(profile.steps_names)) == 3
    with gzip.open(trace, "rt") as handle:
        events = json.load(handle)["traceEvents"]
    steps = [e for e in events if re.fullmatch(r"ProfilerStep#\d+", str(e.get("name")))]
    cpu_steps = [e["name"] for e in steps if e.get("cat") == "user_annotation"]
    assert len(cpu_steps) == 3
    assert {name.split("#")[1] for name in cpu_steps} == set(profile.steps_names)


def test_cuda_trace_has_kernels_and_parses(tmp_path):
    run = _run(tmp_path)
    (trace,) = run.trace_files()
    assert_three_profiled_steps(trace, tmp_path)


def test_nvml_samples_every_gpu(tmp_path):
    run = _run(tmp_path)
    samples = run.samples()
    gpus = samples.filter(pl.col("gpu_index").is_not_null())
    assert gpus.height > 0
    assert set(gpus["gpu_index"]) == set(range(gpus["gpu_index"].max() + 1))
    assert gpus["gpu_util_pct"].is_between(0, 100).all()
    assert (gpus["gpu_mem_total_bytes"] >= gpus["gpu_mem_used_bytes"]).all()
    assert (gpus["gpu_sm_clock_mhz"] > 0).all()
    assert not any(n.startswith("NVML unavailable") for n in run.manifest().notes)


def test_unstable_on_cuda_is_fp16_without_a_scaler(tmp_path):
    run = _run(tmp_path, "--scenario", "unstable")
    assert run.status().status == "completed"
    assert run.steps()["amp_scale"].null_count() == run.steps().height  # no scaler
    assert any("fp16 without GradScaler" in n for n in run.manifest().notes)


def test_cuda_runs_get_the_gpu_size_and_every_step_record(tmp_path):
    run = _run(tmp_path)
    environment = run.manifest().environment
    assert (environment["model_size"], environment["model_size_requested"]) == ("gpu", "auto")
    assert run.manifest().config["model"]["hidden_size"] == 768
    steps = run.steps()
    # records are written once their figures reach the host, all of them, in order
    assert steps["step"].to_list() == list(range(1, steps.height + 1))
    assert steps["loss"].is_finite().all() and steps["grad_norm"].is_finite().all()
    assert (steps["step_time_ms"] > 0).all()
    assert (steps["compute_ms"] <= steps["step_time_ms"] + 0.01).all()
    assert environment["fp32_matmul_precision"] in ("ieee", "tf32")


def test_fp32_scenario_runs_without_amp_or_tf32(tmp_path):
    run = _run(tmp_path, "--scenario", "fp32")
    config = run.manifest().config
    assert (config["train"]["amp"], config["train"]["tf32"]) == ("off", False)
    assert run.manifest().environment["fp32_matmul_precision"] == "ieee"
    assert run.steps()["amp_scale"].null_count() == run.steps().height


def _trainer(tmp_path: Path):
    from trainer.loop import Trainer
    from trainer.run_io import SafeWriter
    from trainer.runtime import StopRequests

    config = build_config(
        "healthy",
        {"data.rows": 1200, "train.pretrain_steps": 2, "instruments.enabled": False},
        resolved_device="cuda",
    )
    writer = RunWriter.create(tmp_path, config.to_dict(), {}, total_steps=config.train.steps)
    trainer = Trainer(
        config,
        SafeWriter(writer),
        device="cuda",
        cache_dir=tmp_path / ".cache",
        stop=StopRequests(),
    )
    return trainer, config, writer


def test_a_training_step_never_synchronises_in_the_trainers_code(tmp_path):
    """Clock, loss, grad norm, clipping, the skip of non-finite steps and the record: none
    waits for the device. torch's sync debug mode warns at every synchronising call, from
    the Python line that made it; none may come from trainer/. (transformers' SDPA mask
    check, ``padding_mask.all()`` in masking_utils, syncs in the model's forward: that is
    the workload, the same with instruments on and off.)"""
    from trainer.data import EpochBatches, take_loading_wait_ms
    from trainer.loop import Position

    trainer, config, writer = _trainer(tmp_path)
    batches = EpochBatches(
        trainer.train_set,
        config.data,
        batch_size=config.train.batch_size,
        seed=0,
        phase="finetune",
        pin_memory=True,
    ).iterate(0, 0)
    trainer.model.train()

    def step(phase: str = "finetune") -> None:
        trainer.clock.begin()
        asked_at = time.monotonic()
        epoch, batch_in_epoch, batch = next(batches)
        trainer.clock.mark("fetched")
        loading_wait_ms = take_loading_wait_ms(batch, asked_at, time.monotonic())
        out = trainer._train_step(phase, batch)
        times = trainer.clock.finish()
        trainer.position = Position(trainer.position.step + 1, phase, epoch, batch_in_epoch)
        trainer._record(phase, epoch, times, out, {"loading_wait_ms": loading_wait_ms})

    step("pretrain")  # masking included: mask_tokens must not sync either
    for _ in range(2):  # cuBLAS handles, optimizer state, pinned host blocks
        step()
    trainer.pending.flush()
    torch.cuda.synchronize()
    ours = str(Path(__file__).resolve().parents[2] / "trainer")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step("pretrain")
            for _ in range(3):
                step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert not [f"{w.filename}:{w.lineno}" for w in syncs if w.filename.startswith(ours)]
    written = trainer.pending.flush()
    assert written >= 1  # lagging records exist until read (every runtime.read_every_steps)
    writer.finalise("completed")
    steps = RunFolder(writer.path).steps()
    assert steps["step"].to_list() == list(range(1, 8))
    assert steps["loss"].is_finite().all()


def test_a_nonfinite_step_is_skipped_on_the_device(tmp_path):
    trainer, config, writer = _trainer(tmp_path)
    from trainer.data import LOADED_AT_KEY, EpochBatches

    batch = next(
        EpochBatches(
            trainer.train_set, config.data, batch_size=8, seed=0, phase="finetune", pin_memory=True
        ).iterate(0, 0)
    )[2]
    del batch[LOADED_AT_KEY]  # the loop takes the load stamp before the step
    trainer.model.train()
    trainer._train_step("finetune", batch)  # one real step: optimizer state exists
    with torch.no_grad():  # every activation after the embeddings' LayerNorm is NaN
        trainer.model.backbone.embeddings.LayerNorm.weight[0] = float("nan")
    before = [p.detach().clone() for p in trainer.model.parameters()]
    out = trainer._train_step("finetune", batch)
    out.scalars.wait()
    values = out.scalars.get()
    assert values["finite"] is False
    after = list(trainer.model.parameters())
    # fused AdamW with found_inf: no parameter moved (NaN where it was NaN)
    for old, new in zip(before, after, strict=True):
        assert torch.equal(torch.nan_to_num(old), torch.nan_to_num(new.detach()))
    writer.finalise("completed")


def test_profiler_leaves_nothing_behind_after_its_window(tmp_path):
    """Issue 9: steady steps took 1.30x as long with instruments on, at the launch-bound
    default size on an H200, ~25 % of it after the profiler's window had closed: Kineto
    kept CUPTI attached (no TEARDOWN_CUPTI). Kernel launches after the window must cost
    what they cost before it, within the spread the same launches show before it."""
    from probe.profiler import TEARDOWN_ENV, TrainingProfiler

    x = torch.ones(16, device="cuda")

    def launches_s(count: int = 4000) -> float:
        torch.cuda.synchronize()
        started = time.perf_counter()
        for _ in range(count):
            x.add_(1)
        elapsed = time.perf_counter() - started
        torch.cuda.synchronize()
        return elapsed

    for _ in range(3):
        launches_s()
    before = [launches_s() for _ in range(9)]
    profiler = TrainingProfiler(ProfilerConfig(), tmp_path, cuda=True, worker_name="w")
    with profiler:
        for _ in range(8):
            x.add_(1)
            profiler.step()
    assert not profiler.attached and list(tmp_path.glob("*.json.gz"))
    import os

    assert os.environ.get(TEARDOWN_ENV) == "1"
    for _ in range(3):  # CUPTI finalises from the next CUDA API callback
        launches_s()
    after = [launches_s() for _ in range(9)]
    # The margin comes from the noise measured before the window: twice the interquartile
    # range of nine repeats (one stray repeat does not widen it), at least 2 %. A host too
    # noisy for that margin to show issue 9's +25 % fails saying so, rather than pass a
    # check that could not have seen the fault.
    typical = statistics.median(before)
    first_quartile, _, third_quartile = statistics.quantiles(before, n=4)
    margin = max(2 * (third_quartile - first_quartile), 0.02 * typical)
    assert margin < 0.25 * typical, f"too noisy to tell a 25 % slowdown: {before}"
    assert statistics.median(after) <= typical + margin, (after, before, margin)
