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
"""
