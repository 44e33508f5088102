"""CUDA paths: CUDA-event timing, AMP with GradScaler, CUDA memory stats, NVML sampling.

Run only where CUDA exists (``scripts/gpu_check.sh`` runs them with a profiled run of every
scenario); everywhere else they are skipped by the marker's skipif.
"""

from __future__ import annotations

import time

import polars as pl
import pytest
import torch
from torch_tb_profiler.profiler.data import RunProfileData

from diagnostics.runs import RunFolder
from tests.conftest import run_trainer_cli

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
    from trainer.instruments.steps import CudaStepClock

    clock = CudaStepClock()
    clock.begin()
    clock.mark("fetched")
    clock.mark("start")
    host = torch.ones(64 * 2**20 // 4).pin_memory()
    host.to("cuda", non_blocking=True)
    clock.mark("copied")
    launched = time.perf_counter()
    torch.cuda._sleep(200_000_000)  # a kernel that spins ~0.1 s or more on any GPU
    launch_ms = (time.perf_counter() - launched) * 1e3
    clock.mark("computed")
    times = clock.finish()
    # the host only queued the kernel; the events saw it run
    assert times["compute_ms"] > 10 * launch_ms
    assert times["compute_ms"] > 20.0
    assert times["h2d_ms"] > 0.0  # 64 MiB over PCIe/NVLink takes measurable time


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


def test_cuda_trace_has_kernels_and_parses(tmp_path):
    run = _run(tmp_path)
    (trace,) = run.trace_files()
    profile = RunProfileData.parse("worker0", "span", str(trace), str(tmp_path))
    assert profile.has_kernel
    assert len(profile.steps_names) == 3


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
