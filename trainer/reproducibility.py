"""The math-library settings under which a CPU run repeats itself bit for bit.

Resume promises the uninterrupted run's losses exactly. torch's CPU matmuls are Intel's
oneMKL, which gives run-to-run identical results only in its conditional numerical
reproducibility mode, with a thread count that it may not adjust at run time (oneMKL
developer guide, "Reproducibility Conditions"). Outside that mode it may choose code
branches and split work differently from one process to the next: CI saw a SIGTERM'd run
differ from its uninterrupted twin from the first fine-tuning step on, by a few units in
the 7th digit, on a host where the same test passes five times in five here.

MKL reads these variables at its first call, not at import: setting them before the first
matmul is enough, torch imported or not (checked with ``MKL_CBWR=COMPATIBLE``, whose
results differ from the default branch's). A value the user set is left alone.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

REPRODUCIBLE_MATH = {
    "MKL_CBWR": "AUTO",  # the CPU's own code branch, taken the same way every run
    "MKL_DYNAMIC": "FALSE",  # the thread count torch sets, never fewer
    "OMP_DYNAMIC": "FALSE",
}


def pin_math_libraries(environ: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Sets each variable the environment lacks; returns the values now in force."""
    environ = os.environ if environ is None else environ
    for name, value in REPRODUCIBLE_MATH.items():
        environ.setdefault(name, value)
    return {name: environ[name] for name in REPRODUCIBLE_MATH}
