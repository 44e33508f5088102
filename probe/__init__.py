"""The instruments: what a training job is measured with, whoever wrote the job.

The reference trainer (``trainer/``) is one client of this package, ``python -m probe
profile`` (any user script, unmodified) another; this package knows neither. Run folders
are written through ``diagnostics.runs``, the one run-folder module. Each instrument has
a no-op twin, so instruments can be switched off.

- :mod:`.profiler`: torch.profiler over a short window of steps chosen by count.
- :mod:`.steps`: the step clock (CUDA events on CUDA, host clocks on CPU) and memory figures.
- :mod:`.deferred`: loss and gradient norm read from the device a few steps later.
- :mod:`.system`: a sampler thread: NVML per GPU, host CPU, process and worker RSS.
- :mod:`.memory_lines`: line-level memory with memory_profiler, on request.

A script's process: :mod:`.cli` (the launcher: ``pipeline-doctor profile``), :mod:`.child`
(runs the script), :mod:`.session` (its steps and records), :mod:`.hooks` and
:mod:`.loaders` (what torch's entry points report). For loops the hooks cannot see:
``probe.step()`` and ``probe.record(...)`` (:mod:`.api`).
"""

from __future__ import annotations

from typing import Any

__all__ = ["record", "step"]


def __getattr__(name: str) -> Any:
    # lazily: "import probe" in a script must not import torch before the script does
    if name in __all__:
        from probe import api

        return getattr(api, name)
    raise AttributeError(name)
