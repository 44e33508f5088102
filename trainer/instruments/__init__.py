"""The trainer's instruments, each with a no-op twin for ``--instruments off``.

- :mod:`.profiler`: torch.profiler over a short scheduled window (TensorBoard layout).
- :mod:`.steps`: per-step timing (CUDA events on CUDA, host clocks on CPU) and memory.
- :mod:`.system`: a 10 Hz sampler thread: NVML per GPU, host CPU, trainer and worker RSS.
- :mod:`.memory_lines`: line-level memory with memory_profiler, on request.
"""
