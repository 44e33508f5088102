"""The property test_gpu.py asserts of a fresh CUDA trace, on a real one from the H200.

h200-default/gpu-healthy (PyTorch 2.11, ../shared/gpu-runs) is the trace on which the old
assertion (six step names for three steps) failed: each ProfilerStep#N is on the CPU and on
the GPU timeline. The corrected assertion must hold on it in CPU-only CI.
"""

from __future__ import annotations

from pathlib import Path

from tests.trainer.test_gpu import assert_three_profiled_steps

GPU_RUNS = Path(__file__).resolve().parents[2].parent / "shared" / "gpu-runs"


def test_h200_trace_has_three_steps_each_on_cpu_and_gpu(tmp_path):
    (trace,) = (GPU_RUNS / "h200-default" / "gpu-healthy" / "trace").glob("*.json.gz")
    assert_three_profiled_steps(trace, tmp_path)
