"""Times checked where they enter: each event's timestamp and duration against the trace's
own span and physical bounds.

A single wrong number moves every figure downstream: a kernel at ``ts`` 1e30 stretches the
recording to 10^24 years and makes the median step 0.0 ms; a ``dur`` of 1e18 makes one
kernel busier than the whole job; every kernel at ``dur`` 0 halves nothing but silently
empties the GPU timeline. So each case is either excluded with a warning that names the
count and the effect, or, where nothing is lost (a few sub-µs events rounded to 0 by old
Kineto versions), kept as it is:

- a timestamp beyond ``PHYSICAL_TS_LIMIT_US`` (no clock, epoch or relative, reaches it), or
  farther outside the central range of the file's timestamps (0.1 % to 99.9 %) than
  ``FAR_FACTOR`` times that range's width: excluded;
- a duration longer than ``LONGER_THAN_RECORDING`` times the recording (first start to the
  99.9th percentile of the ends, at least a millisecond): excluded;
- kernels of zero duration: when they are at least ``ZERO_KERNEL_SHARE`` of the file's
  kernels, the GPU timeline is unusable and every GPU event is excluded (the job still reads
  as a GPU job through its launch calls, with its GPU figures unknown); fewer are kept
  (the V100 traces of PyTorch 1.9 hold 7 % of them: sub-µs copies and memsets).

Negative and non-finite durations are refused earlier, as malformed (normalise.py).
"""

from __future__ import annotations

import polars as pl

PHYSICAL_TS_LIMIT_US = 1e17  # about 3,200 years of µs
FAR_FACTOR = 100.0
CORE_QUANTILES = (0.001, 0.999)
# Far beyond: an exported step keeps the whole recording's profiler span, twice its own
# length or more; nothing real lasts a hundred recordings.
LONGER_THAN_RECORDING = 100.0
MIN_RECORDING_US = 1000.0
ZERO_KERNEL_SHARE = 0.5
ZERO_KERNEL_MIN = 20  # a handful of kernels says nothing about the timeline
_GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")


def _count(n: int, word: str) -> str:
    return f"{n:,} {word}" if n == 1 else f"{n:,} {word}s"


def _far_timestamps(events: pl.DataFrame) -> pl.Series:
    ts = events["ts"]
    lo, hi = ts.quantile(CORE_QUANTILES[0], "lower"), ts.quantile(CORE_QUANTILES[1], "higher")
    if lo is None or hi is None:
        return pl.Series([False] * events.height)
    reach = FAR_FACTOR * max(float(hi) - float(lo), 1.0)
    return (ts.abs() > PHYSICAL_TS_LIMIT_US) | (ts < float(lo) - reach) | (ts > float(hi) + reach)


def check_times(events: pl.DataFrame, display: str) -> tuple[pl.DataFrame, list[str]]:
    """The event table without the events whose times cannot be right, and one warning for
    each kind of exclusion (see the module docstring)."""
    if events.height == 0:
        return events, []
    warnings: list[str] = []
    far = _far_timestamps(events)
    n_far = int(far.sum())
    if n_far:
        kept_ts = events.filter(~far)["ts"]
        worst = events.filter(far)["ts"].abs().max()
        others = (
            f"the others lie within {(float(kept_ts.max()) - float(kept_ts.min())) / 1e6:.3g} s"
            if kept_ts.len()
            else "no other event is left"
        )
        warnings.append(
            f"{display}: left out {_count(n_far, 'event')} whose timestamp lies far outside the "
            f"recording (up to {worst:.3g} µs; {others}): they would stretch its span and "
            "every time measured over it"
        )
        events = events.filter(~far)
    # The recording runs from the first start to nearly the last end: the 99.9th percentile
    # of the ends, so that one absurd end does not stretch the yardstick it is judged by.
    ends = events["ts"] + events["dur"].fill_null(0.0)
    last_end = ends.quantile(CORE_QUANTILES[1], "higher") if events.height else None
    span = float(last_end) - float(events["ts"].min()) if last_end is not None else 0.0
    longest = LONGER_THAN_RECORDING * max(span, MIN_RECORDING_US)
    too_long = events["dur"].fill_null(0.0) > longest
    n_long = int(too_long.sum())
    if n_long:
        worst = float(events.filter(too_long)["dur"].max())
        warnings.append(
            f"{display}: left out {_count(n_long, 'event')} that last longer than the whole "
            f"recording ({worst:.3g} µs against {span / 1e6:.3g} s): busy time, step ends and "
            "every union of time they are part of would be wrong"
        )
        events = events.filter(~too_long)
    kernels = events.filter(pl.col("cat") == "kernel")
    zero = int((kernels["dur"] == 0).sum()) if kernels.height else 0
    if kernels.height >= ZERO_KERNEL_MIN and zero >= ZERO_KERNEL_SHARE * kernels.height:
        gpu = pl.col("cat").is_in(_GPU_CATS)
        n_gpu = int(events.select(gpu.sum()).item())
        warnings.append(
            f"{display}: {zero:,} of {kernels.height:,} kernels have zero duration, so the GPU "
            f"timeline is unusable: its {_count(n_gpu, 'GPU event')} are left out, and GPU "
            "busy and idle time, utilisation and kernel times are unknown"
        )
        events = events.filter(~gpu)
    return events, warnings
