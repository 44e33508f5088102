"""The math-library settings that bitwise resume rests on (trainer/reproducibility.py)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from trainer.reproducibility import REPRODUCIBLE_MATH, pin_math_libraries


def test_pinning_fills_in_what_the_environment_lacks():
    environ = {"PATH": "/usr/bin"}
    assert pin_math_libraries(environ) == REPRODUCIBLE_MATH
    assert environ["MKL_CBWR"] == "AUTO"
    assert environ["MKL_DYNAMIC"] == "FALSE"
    assert environ["PATH"] == "/usr/bin"


def test_a_value_the_user_set_is_kept():
    environ = {"MKL_CBWR": "AVX2", "OMP_DYNAMIC": "TRUE"}
    assert pin_math_libraries(environ) == {
        "MKL_CBWR": "AVX2",
        "MKL_DYNAMIC": "FALSE",
        "OMP_DYNAMIC": "TRUE",
    }


MATMUL = """
import hashlib, os, sys
if sys.argv[1] == "before":
    os.environ["MKL_CBWR"] = "COMPATIBLE"
import torch
if sys.argv[1] == "after":
    os.environ["MKL_CBWR"] = "COMPATIBLE"
torch.manual_seed(0)
a, b = torch.randn(300, 257), torch.randn(257, 301)
print(hashlib.md5((a @ b).numpy().tobytes()).hexdigest())
"""


def _matmul_digest(when: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in REPRODUCIBLE_MATH}
    done = subprocess.run(
        [sys.executable, "-c", MATMUL, when], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="torch built without MKL")
def test_mkl_reads_the_setting_at_its_first_call_so_after_importing_torch_is_in_time():
    """The trainer pins the variables in ``main``, which may run after torch is imported:
    that works only while MKL reads them lazily. COMPATIBLE (the SSE2 branch) gives other
    bits than this CPU's own branch, so it shows whether the setting was read."""
    default, before, after = (_matmul_digest(w) for w in ("none", "before", "after"))
    assert before != default
    assert after == before
