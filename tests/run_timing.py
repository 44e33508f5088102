"""Speed compared between runs that trained side by side, fairly on a loaded host.

Runs started together do not train over the same seconds: one starts its steps later or
ends sooner, and the part of its life the other does not share meets a busier or quieter
machine. Whole-run median step times then differ by the host's load, not by the change
under test. These helpers compare the runs over the wall-clock window they all trained in.
"""

from __future__ import annotations

import contextlib
import os

import polars as pl

# each rate is counted over at least this many step ends inside the shared window
MIN_STEPS_IN_WINDOW = 6


def shared_window(*steps: pl.DataFrame) -> tuple[float, float]:
    """(start, end) in wall-clock seconds when every run was past its first step (which
    starts its workers) and none had finished; ``steps`` are step records with
    ``wall_time``, each step's end."""
    start = max(float(s.slice(1)["wall_time"].min()) for s in steps)
    end = min(float(s["wall_time"].max()) for s in steps)
    assert start < end, "the runs never trained at the same time"
    return start, end


def steps_per_s_within(steps: pl.DataFrame, window: tuple[float, float]) -> float:
    """A run's training rate inside ``window``: the steps that ended in it, over the time
    between the first and the last of those step ends."""
    start, end = window
    ends = steps.slice(1)["wall_time"]
    inside = ends.filter((ends >= start) & (ends <= end)).sort()
    assert inside.len() >= MIN_STEPS_IN_WINDOW, f"only {inside.len()} steps in the shared window"
    return (inside.len() - 1) / (inside[-1] - inside[0])


# How far a measured child is raised above the host's other work (nice -15): enough that
# CFS gives it most of a core beside busy loops and other tests' processes.
MEASURED_NICE = -15


def raise_priority() -> None:
    """A ``preexec_fn`` for a child whose step-time shares are measured: on a loaded host
    the scheduler's preemptions land mostly in its Python code, not in the short C calls
    being timed, so shares such as reads over data wait shrink with the load (39-42 % on an
    idle host and at nice -15 under a load of 11; 5-13 % at nice 0 under the same load).
    Only root may raise a priority (as CI's container runs); elsewhere the child runs at the
    normal priority and the shares are those of the load it meets."""
    with contextlib.suppress(PermissionError):
        os.nice(MEASURED_NICE)


# A job whose advice is sized from the CPU left free to it (too-few-workers' worker count)
# runs above the measured jobs too: the suite's other jobs, measured ones included, are no
# part of the machine its fix will run on, and against nice -20 a nice -15 process keeps a
# third of a contended core (CFS's weights 29154 and 88761), a nice-0 one 1 %.
OWNER_NICE = -20


def raise_priority_to_owner() -> None:
    """A ``preexec_fn`` running a child at OWNER_NICE where the user is root (elsewhere at
    the normal priority, its advice then sized for the load it meets)."""
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, OWNER_NICE)
